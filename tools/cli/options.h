// Command-line parsing for `msa`: a flat "--name value" / "--name=value" grammar checked against
// each subcommand's option table (which also prints its --help), plus the shape options that
// demo and bench share. Bad input throws UsageError, which main() turns into exit code 2.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "workloads/cases.h"

namespace msa::cli {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct OptionSpec {
  std::string name;   // without the leading "--"
  std::string value;  // placeholder shown in --help ("N", "FILE"); empty for a flag
  std::string help;
};

class ParsedArgs {
 public:
  // args: everything after the subcommand. Throws UsageError for an unknown option, a missing
  // value, a value given to a flag, a repeated option or a positional argument.
  ParsedArgs(const std::vector<OptionSpec>& specs, const std::vector<std::string>& args);

  bool has(std::string_view name) const { return values_.count(std::string(name)) > 0; }
  std::optional<std::string> text(std::string_view name) const;
  // An integer in [lo, hi]; UsageError naming the option otherwise.
  std::optional<int64_t> integer(std::string_view name, int64_t lo, int64_t hi) const;
  // One of `choices`; UsageError listing them otherwise.
  std::optional<std::string> choice(std::string_view name,
                                    const std::vector<std::string>& choices) const;

 private:
  std::map<std::string, std::string> values_;
};

void print_help(std::ostream& os, const std::string& usage, const std::string& summary,
                const std::vector<OptionSpec>& specs);

// Shape options; absent ones take the command's (and device's) defaults.
struct ShapeOptions {
  std::optional<int64_t> batch, seq, hq, hkv, dim, topk, blk;
  std::optional<std::vector<int64_t>> seqlens;  // --seqlens a,b,c: varlen, one entry per request
  std::optional<bool> causal;
  std::optional<bench::Pattern> pattern;
  std::optional<uint64_t> seed;
  bool any_length() const { return batch || seq || seqlens; }
  bool any() const { return any_length() || hq || hkv || dim || topk || blk || causal || pattern || seed; }
};
std::vector<OptionSpec> shape_option_specs(bool with_pattern);
ShapeOptions parse_shape_options(const ParsedArgs& args);

// A problem shape after defaults: every request has Lq = Lk = seqlens[b]; heads, head dim,
// selection and seed as a named case holds them (their defaults are the cases' defaults).
struct Shape : bench::CaseShape {
  std::vector<int64_t> seqlens;
  // Index heads of a separate index branch (demo): index_q [total, Hi, D] and index_k
  // [total, Hkv, D] of their own, Hi a multiple of Hkv. 0: the indexer scores with q and k.
  int index_heads = 0;
};
// Applies the options on top of `defaults`; UsageError when the result breaks a rule the CLI can
// state up front (Hq a multiple of Hkv with G in {1, 2, 4, 8, 16}, blk 64 or 128, ...).
Shape resolve_shape(const ShapeOptions& o, Shape defaults);
// Host bytes a run of shape s allocates at least (inputs, q2k and CSR, materialized block scores),
// and the check that they fit in this machine's memory (UsageError otherwise), which the demo and
// the CPU timing run before they allocate.
int64_t host_bytes_needed(const Shape& s);
void check_host_memory(const Shape& s);
std::string describe(const Shape& s);  // "B=1 S=2048 Hq=16 Hkv=2 (G=8) D=128 blk=128 topK=8 causal"

// --device cpu|gpu|auto
enum class DeviceChoice { auto_select, cpu, gpu };
OptionSpec device_option_spec();
DeviceChoice parse_device(const ParsedArgs& args);

}  // namespace msa::cli
