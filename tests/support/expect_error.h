// The check every argument-error test shares: calling f throws msa::Error whose message
// contains `needle` (the argument and the rule it broke); expect_arg_error applies it to valid
// arguments with one change.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "msa/error.h"

namespace msa::test {

template <typename F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected msa::Error containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// `op` on a copy of the valid arguments `valid` altered by `change` throws msa::Error containing
// `needle`: one argument rule per call, each starting from the same valid arguments.
template <typename Op, typename Args, typename Change>
void expect_arg_error(Op op, const Args& valid, Change change, const std::string& needle) {
  Args a = valid;
  change(a);
  expect_error([&] { op(a); }, needle);
}

}  // namespace msa::test
