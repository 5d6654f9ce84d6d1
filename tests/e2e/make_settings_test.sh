#!/bin/bash
# Makefile.inc's site settings reach CMake: the compilers and MPI wrapper configure passes, as
# edited in Makefile.inc, as given in the environment and on the command line (the command
# line winning). make predefines CC and CXX, so a plain `?=` for them would ignore the edit.
# Dry runs (`make -n`) of copies of the two files: nothing is built or installed.
set -u
SRC=${DDPV_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
command -v make >/dev/null || { echo "skip: no make"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cp "$SRC/Makefile" "$SRC/Makefile.inc" "$tmp/"
# flags [NAME=value ...] [-- make arguments]: configure's cmake line as make would run it, with
# the environment cleared of the settings and of an outer make's (MAKEFLAGS carries its
# command line: `make test CXX=...`), then given the NAME=values.
flags() {
  local envs=()
  while (($# > 0)) && [[ $1 != -- ]]; do envs+=("$1"); shift; done
  (($# > 0)) && shift
  (cd "$tmp" && env -u CC -u CXX -u MPICXX -u MAKEFLAGS -u MFLAGS -u MAKELEVEL "${envs[@]}" \
    make -n configure "$@" 2>/dev/null | grep '^cmake ')
}

line=$(flags) || fail "make -n configure printed no cmake line"
[[ $line == *"-DCMAKE_C_COMPILER=gcc "* && $line == *"-DCMAKE_CXX_COMPILER=g++ "* ]] ||
  fail "the defaults are not gcc / g++: $line"
[[ $line == *"-DMPI_CXX_COMPILER=mpicxx "* ]] || fail "the MPI wrapper default: $line"

sed -i 's/^CC = gcc$/CC = site-cc/; s/^CXX = g++$/CXX = site-c++/; s/^MPICXX ?= mpicxx$/MPICXX ?= site-mpicxx/' \
  "$tmp/Makefile.inc"
line=$(flags)
[[ $line == *"-DCMAKE_C_COMPILER=site-cc "* && $line == *"-DCMAKE_CXX_COMPILER=site-c++ "* ]] ||
  fail "compilers edited in Makefile.inc were ignored: $line"
[[ $line == *"-DMPI_CXX_COMPILER=site-mpicxx "* ]] || fail "MPICXX edited in Makefile.inc was ignored: $line"

line=$(flags CC=env-cc CXX=env-c++)
[[ $line == *"-DCMAKE_C_COMPILER=env-cc "* && $line == *"-DCMAKE_CXX_COMPILER=env-c++ "* ]] ||
  fail "compilers from the environment were ignored: $line"

line=$(flags CXX=env-c++ -- CXX=cli-c++)
[[ $line == *"-DCMAKE_CXX_COMPILER=cli-c++ "* ]] || fail "the command line did not win: $line"
echo "make settings: defaults, Makefile.inc edits, environment and command line all reach cmake"
