// Words for enums: the one table per enum that parses an option's value and prints it back.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace ddpv {

// Note [Choices]: an option that takes one of a few words (--precision fp32|bf16|fp16,
// --lr-schedule, --mpi-progress, --device, --reduce-dtype) is an enum from the command line on;
// nothing past the parser compares strings. Each such enum E declares, next to itself,
//
//   std::span<const ChoiceWord<E>> choices(E);
//
// its words in order, the first word of each value being the one it prints as and any later
// one an alias it also accepts. The functions below read only that table, so the words a user
// may type, the ones --help, errors and a checkpoint's stored config show, and the list an
// error offers cannot disagree. The argument of choices() is a tag (E{}), found by
// argument-dependent lookup.
template <class E>
struct ChoiceWord {
  const char* word;
  E value;
};

// The word `value` prints as ("?" for a value outside the table).
template <class E>
const char* choice_name(E value) {
  for (const ChoiceWord<E>& c : choices(E{}))
    if (c.value == value) return c.word;
  return "?";
}

// The value `word` names, exactly as the table spells it; none for any other text.
template <class E>
std::optional<E> find_choice(std::string_view word) {
  for (const ChoiceWord<E>& c : choices(E{}))
    if (word == c.word) return c.value;
  return std::nullopt;
}

// "fp32, bf16 or fp16": each value's printed word, for an error that says what to use.
template <class E>
std::string choice_list() {
  std::string out;
  const auto table = choices(E{});
  size_t named = 0, total = 0;
  for (size_t i = 0; i < table.size(); ++i)
    if (choice_name(table[i].value) == std::string_view(table[i].word)) ++total;
  for (size_t i = 0; i < table.size(); ++i) {
    if (choice_name(table[i].value) != std::string_view(table[i].word)) continue;  // an alias
    ++named;
    if (named > 1) out += named == total ? " or " : ", ";
    out += table[i].word;
  }
  return out;
}

}  // namespace ddpv
