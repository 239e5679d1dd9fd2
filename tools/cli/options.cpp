// Option parsing and shape resolution for `msa` (see options.h).
#include "options.h"

#include <unistd.h>

#include <iomanip>
#include <sstream>

#include "msa/error.h"

namespace msa::cli {
namespace {

const OptionSpec* find_spec(const std::vector<OptionSpec>& specs, std::string_view name) {
  for (const OptionSpec& s : specs)
    if (s.name == name) return &s;
  return nullptr;
}

int64_t to_integer(std::string_view name, const std::string& v) {
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size())
    throw UsageError(detail::concat("--", name, ": expected an integer, got '", v, "'"));
  return x;
}

std::vector<int64_t> to_list(std::string_view name, const std::string& v) {
  std::vector<int64_t> out;
  std::stringstream ss(v);
  for (std::string item; std::getline(ss, item, ',');) {
    const int64_t x = to_integer(name, item);
    if (x < 0) throw UsageError(detail::concat("--", name, ": lengths must be >= 0, got ", x));
    out.push_back(x);
  }
  if (out.empty()) throw UsageError(detail::concat("--", name, ": expected a list like 1024,2048"));
  return out;
}

}  // namespace

ParsedArgs::ParsedArgs(const std::vector<OptionSpec>& specs, const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2)
      throw UsageError(detail::concat("unexpected argument '", a, "' (options start with --)"));
    const size_t eq = a.find('=');
    const std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const OptionSpec* spec = find_spec(specs, name);
    if (spec == nullptr) throw UsageError(detail::concat("unknown option --", name));
    if (values_.count(name)) throw UsageError(detail::concat("--", name, " given twice"));
    if (spec->value.empty()) {
      if (eq != std::string::npos) throw UsageError(detail::concat("--", name, " takes no value"));
      values_[name] = "";
    } else if (eq != std::string::npos) {
      values_[name] = a.substr(eq + 1);
    } else {
      if (i + 1 >= args.size())
        throw UsageError(detail::concat("--", name, " needs a value (", spec->value, ")"));
      values_[name] = args[++i];
    }
  }
}

std::optional<std::string> ParsedArgs::text(std::string_view name) const {
  auto it = values_.find(std::string(name));
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> ParsedArgs::integer(std::string_view name, int64_t lo, int64_t hi) const {
  auto v = text(name);
  if (!v) return std::nullopt;
  const int64_t x = to_integer(name, *v);
  if (x < lo || x > hi)
    throw UsageError(detail::concat("--", name, ": must be in [", lo, ", ", hi, "], got ", x));
  return x;
}

std::optional<std::string> ParsedArgs::choice(std::string_view name,
                                              const std::vector<std::string>& choices) const {
  auto v = text(name);
  if (!v) return std::nullopt;
  for (const std::string& c : choices)
    if (*v == c) return v;
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : "|") + c;
  throw UsageError(detail::concat("--", name, ": must be one of ", list, ", got '", *v, "'"));
}

void print_help(std::ostream& os, const std::string& usage, const std::string& summary,
                const std::vector<OptionSpec>& specs) {
  os << "usage: " << usage << "\n\n" << summary << "\n\noptions:\n";
  for (const OptionSpec& s : specs) {
    const std::string left = "--" + s.name + (s.value.empty() ? "" : " " + s.value);
    os << "  " << std::left << std::setw(22) << left << " " << s.help << "\n";
  }
}

std::vector<OptionSpec> shape_option_specs(bool with_pattern) {
  std::vector<OptionSpec> v = {
      {"batch", "N", "requests B (each of --seq tokens)"},
      {"seq", "N", "tokens per request (queries = keys)"},
      {"seqlens", "L1,L2,..", "varlen: tokens of each request (instead of --batch/--seq)"},
      {"hq", "N", "query heads Hq"},
      {"hkv", "N", "kv heads Hkv (G = Hq / Hkv in {1, 2, 4, 8, 16})"},
      {"dim", "N", "head dim D"},
      {"topk", "N", "selected kv blocks per (kv head, query)"},
      {"blk", "N", "kv block size, 64 or 128"},
      {"causal", "0|1", "bottom-right causal mask (default 1)"},
      {"seed", "N", "random seed for inputs and selections (default 1)"},
  };
  if (with_pattern)
    v.push_back({"pattern", "tok|blk|idx", "selection: per token, per 128-query block, or indexer"});
  return v;
}

ShapeOptions parse_shape_options(const ParsedArgs& a) {
  constexpr int64_t kMaxLen = int64_t{1} << 30;
  ShapeOptions o;
  o.batch = a.integer("batch", 1, 1 << 20);
  o.seq = a.integer("seq", 0, kMaxLen);
  if (auto v = a.text("seqlens")) o.seqlens = to_list("seqlens", *v);
  if (o.seqlens && (o.batch || o.seq))
    throw UsageError("--seqlens replaces --batch/--seq; give one or the other");
  o.hq = a.integer("hq", 1, 1024);
  o.hkv = a.integer("hkv", 1, 1024);
  o.dim = a.integer("dim", 1, 1024);
  o.topk = a.integer("topk", 1, 1 << 16);
  o.blk = a.integer("blk", 1, 1 << 16);
  if (auto c = a.choice("causal", {"0", "1"})) o.causal = *c == "1";
  if (auto s = a.integer("seed", 0, INT64_MAX)) o.seed = static_cast<uint64_t>(*s);
  if (auto p = a.text("pattern")) {
    bench::Pattern pat;
    if (!bench::parse_pattern(*p, &pat))
      throw UsageError(detail::concat("--pattern: must be one of tok|blk|idx, got '", *p, "'"));
    o.pattern = pat;
  }
  return o;
}

Shape resolve_shape(const ShapeOptions& o, Shape s) {
  if (o.seqlens) {
    s.seqlens = *o.seqlens;
  } else if (o.batch || o.seq) {
    const int64_t len = o.seq.value_or(s.seqlens.empty() ? 0 : s.seqlens[0]);
    s.seqlens.assign(static_cast<size_t>(o.batch.value_or(1)), len);
  }
  s.num_q_heads = static_cast<int>(o.hq.value_or(s.num_q_heads));
  s.num_kv_heads = static_cast<int>(o.hkv.value_or(s.num_kv_heads));
  s.head_dim = static_cast<int>(o.dim.value_or(s.head_dim));
  s.topk = static_cast<int>(o.topk.value_or(s.topk));
  s.kv_block_size = static_cast<int>(o.blk.value_or(s.kv_block_size));
  s.causal = o.causal.value_or(s.causal);
  s.pattern = o.pattern.value_or(s.pattern);
  s.seed = o.seed.value_or(s.seed);
  if (s.num_q_heads % s.num_kv_heads != 0)
    throw UsageError(detail::concat("--hq ", s.num_q_heads, " must be a multiple of --hkv ",
                                    s.num_kv_heads));
  const int g = s.num_q_heads / s.num_kv_heads;
  if (g != 1 && g != 2 && g != 4 && g != 8 && g != 16)
    throw UsageError(detail::concat("G = Hq / Hkv must be 1, 2, 4, 8 or 16, got ", g));
  if (s.kv_block_size != 64 && s.kv_block_size != 128)
    throw UsageError(detail::concat("--blk must be 64 or 128, got ", s.kv_block_size));
  // What the stages would refuse after earlier ones ran: checked before any of them.
  if (s.head_dim % 16 != 0)
    throw UsageError(detail::concat("--dim must be a multiple of 16 (rows of bf16 and FP8 inputs ",
                                    "are 16-byte aligned), got ", s.head_dim));
  if (s.topk < 2)
    throw UsageError(detail::concat("--topk must be >= 2: the sink block and the local block are ",
                                    "always selected, got ", s.topk));
  return s;
}

int64_t host_bytes_needed(const Shape& s) {
  int64_t bytes = 0;
  for (int64_t len : s.seqlens) {
    const int64_t blocks = (len + s.kv_block_size - 1) / s.kv_block_size;
    bytes += len * (2 * int64_t(s.num_q_heads) + 2 * int64_t(s.num_kv_heads)) * s.head_dim * 2;
    bytes += len * int64_t(s.num_kv_heads) * s.topk * 4 * 3;            // q2k, the CSR
    bytes += int64_t(s.num_q_heads) * blocks * len * 4;                  // block scores
  }
  return bytes;
}

void check_host_memory(const Shape& s) {
  const int64_t pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return;  // unknown: the allocation itself will say
  const double need = double(host_bytes_needed(s)), have = double(pages) * double(page);
  if (need > 0.75 * have)
    throw UsageError(detail::concat("this shape needs about ", int64_t(need / 1e9 + 1),
                                    " GB of host memory (inputs, selections, block scores), more ",
                                    "than the ", int64_t(have / 1e9), " GB this machine has "
                                    "allows; use a smaller --seq / --batch / --hq"));
}

std::string describe(const Shape& s) {
  std::ostringstream os;
  os << "B=" << s.seqlens.size();
  if (s.seqlens.size() == 1) {
    os << " S=" << s.seqlens[0];
  } else {
    os << " S=";
    for (size_t b = 0; b < s.seqlens.size(); ++b) os << (b ? "," : "") << s.seqlens[b];
  }
  os << " Hq=" << s.num_q_heads << " Hkv=" << s.num_kv_heads << " (G="
     << s.num_q_heads / s.num_kv_heads << ") D=" << s.head_dim << " blk=" << s.kv_block_size
     << " topK=" << s.topk << (s.causal ? " causal" : " non-causal");
  if (s.index_heads > 0) os << ", index branch Hi=" << s.index_heads << " on " << s.num_kv_heads << " key heads";
  return os.str();
}

OptionSpec device_option_spec() {
  return {"device", "cpu|gpu|auto", "where to run (default auto: the GPU when this build and machine have one)"};
}

DeviceChoice parse_device(const ParsedArgs& a) {
  const auto d = a.choice("device", {"cpu", "gpu", "auto"});
  if (!d || *d == "auto") return DeviceChoice::auto_select;
  return *d == "cpu" ? DeviceChoice::cpu : DeviceChoice::gpu;
}

}  // namespace msa::cli
