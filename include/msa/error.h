// msa::Error and the argument-checking helpers used by every public entry point.
// Messages name the argument and the rule it broke, e.g. "q: dtype must be bf16 or f16, got f32".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace msa {

// The one exception type msa throws for bad input, unsupported features and device errors.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Throws msa::Error with the concatenated message.
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(detail::concat(args...));
}

}  // namespace msa

// MSA_CHECK(cond, parts...): throws msa::Error(parts...) when cond is false.
#define MSA_CHECK(cond, ...)              \
  do {                                    \
    if (!(cond)) ::msa::fail(__VA_ARGS__); \
  } while (0)
