#!/usr/bin/env python3
"""fuzz_triage.py REPO BINARY ARTIFACT...: says whose each libFuzzer finding is.

Each artifact (crash-*, oom-*, timeout-*, leak-* under a fuzz run's artifact folder) is run
again alone through BINARY, and the sanitizer's or libFuzzer's report is read:
  ours      the first frame of the report that is not the sanitizer's, libFuzzer's, the C or
            C++ runtime's or an allocator is in our source tree (REPO), or none can be named;
  library   that frame is in one of the libraries we parse with (libhdf5, libpng, libjpeg,
            zlib), and for a bad access, the buffer is not one our code allocated (a library
            overrunning our buffer was given a wrong size by us: ours);
  flaky     the input does not fail when run again alone (a finding that depended on the
            fuzzer process's earlier inputs is reported, not failed on).
Prints one line per artifact, `VERDICT ARTIFACT: what (where)`, and exits 1 if any is ours.
Also importable: classify(report_text, repo) for tests on kept reports.
"""
import os
import re
import subprocess
import sys

LIBRARIES = ("libhdf5", "libpng", "libjpeg", "libturbojpeg", "libz.so", "libsz", "libaec")
# Frames that say nothing about whose the bug is.
SKIP_FUNCS = re.compile(
    r"^(__sanitizer|__asan|__ubsan|__lsan|__interceptor|___interceptor|__interception|"
    r"fuzzer::|LLVMFuzzer|operator new|operator delete|malloc|calloc|realloc|free|"
    r"posix_memalign|aligned_alloc|abort|raise|gsignal|__GI_|__libc_|__cxa_|__cxxabiv1|"
    r"std::terminate|__gnu_cxx::__verbose_terminate_handler|std::__throw|std::__terminate|"
    r"mem(cpy|move|set|cmp)|__mem|str(len|cpy|cmp|ncpy|nlen)|__str|_start$|main$|"
    r"std::(vector|__new_allocator|allocator|__cxx11::basic_string|_Vector_base|"
    r"__uninitialized|__do_uninit|_Construct)|__gnu_cxx::new_allocator)")
SKIP_OBJECTS = ("libclang_rt", "libc.so", "libstdc++", "libgcc_s", "ld-linux", "libm.so",
                "/include/c++/")
REPORT = re.compile(
    r"(ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)[^\n]*|runtime error: [^\n]*)")
FRAME = re.compile(r"^\s*#\d+ 0x[0-9a-f]+ (?:in (.+?) )?(\(?\S+?(?::\d+)*(?:\+0x[0-9a-f]+)?\)?)$")
UBSAN_AT = re.compile(r"^(\S+?):\d+:\d+: runtime error: ", re.M)


def classify(text, repo):
    """(verdict, what, where) for one report."""
    repo = os.path.realpath(repo) + "/"
    m = REPORT.search(text)
    if not m:
        return ("flaky", "no report", "")
    what = m.group(1).strip()
    ub = UBSAN_AT.search(text)
    if ub and os.path.realpath(ub.group(1)).startswith(repo):
        return ("ours", what, ub.group(1))
    # A library that overran or reused a buffer our code allocated was handed a wrong size or
    # a dead pointer by us: whose the buffer is decides, not where the read happened.
    alloc = re.search(r"^(?:\S.* )?(allocated|freed) by thread .*$", text[m.start():], re.M)
    if alloc and "AddressSanitizer" in what:
        frame = first_frame(text[m.start() + alloc.end() + 1:], repo, stop_at_blank=True)
        if frame and frame[0] == "ours":
            return ("ours", what, "a buffer of ours: " + frame[1])
    frame = first_frame(text[m.start():], repo)
    if frame:
        return (frame[0], what, frame[1])
    return ("ours", what, "no frame of ours or of a library could be named")


def first_frame(text, repo, stop_at_blank=False):
    """('ours' | 'library', where) of the first frame that names whose code it is, or None."""
    for line in text.splitlines():
        if stop_at_blank and not line.strip():
            break
        f = FRAME.match(line)
        if not f:
            continue
        func, where = (f.group(1) or ""), f.group(2).strip("()")
        if func and SKIP_FUNCS.match(func):
            continue
        if any(o in where for o in SKIP_OBJECTS):
            continue
        path = os.path.realpath(where.split(":")[0]) + "/" if where.startswith("/") else where
        if path.startswith(repo):
            return ("ours", f"{func} {where}".strip())
        if any(lib in where for lib in LIBRARIES) or func.startswith(("H5", "png_", "jpeg_")):
            return ("library", f"{func} {where}".strip())
        # A frame of a header-only library inlined into our code names its header: keep going.
    return None


def rerun(binary, artifact, timeout):
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
    try:
        p = subprocess.run([binary, "-rss_limit_mb=2048", "-timeout=30", artifact],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                           timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or b"").decode("utf-8", "replace") + "\nERROR: libFuzzer: timeout (rerun)"


def main(argv):
    if len(argv) < 3:
        print("usage: fuzz_triage.py REPO BINARY ARTIFACT...", file=sys.stderr)
        return 2
    repo, binary, artifacts = argv[0], argv[1], argv[2:]
    ours = 0
    for a in artifacts:
        code, out = rerun(binary, a, 120)
        verdict, what, where = ("flaky", "passes when run alone", "") if code == 0 else classify(out, repo)
        ours += verdict == "ours"
        print(f"{verdict} {a}: {what}" + (f" ({where})" if where else ""))
        if verdict == "ours":
            with open(a + ".report", "w") as f:
                f.write(out)
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
