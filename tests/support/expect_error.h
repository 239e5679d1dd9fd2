// The check every argument-error test shares: calling f throws msa::Error whose message
// contains `needle` (the argument and the rule it broke).
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

}  // namespace msa::test
