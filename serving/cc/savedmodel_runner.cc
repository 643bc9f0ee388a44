// savedmodel_runner: mimic TF Serving's SavedModel load-and-run path.
// Usage:
//   savedmodel_runner [--xla=off|on] [--tags=serve] [--signature=serving_default]
//                     <export_dir> <inputs_file | name:dtype:shape:values ...>
// Input spec (file, one input per non-empty, non-# line, or as args):
//   name:dtype:shape:values    e.g.  x:int32:2,3:1,2,3,4,5,6
//   dtype in {int32,int64,float32,float64,bool,string}; shape "" means scalar.
//   In files, whitespace may be used instead of ':' (name dtype shape values).
// Output: one JSON line per signature output (sorted by output key) on stdout;
//   load time as {"load_time_ms":...} on stderr.  Errors -> stderr, exit 1.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "tensorflow/cc/saved_model/loader.h"
// NOTE: tensorflow/cc/saved_model/tag_constants.h is NOT shipped in the wheel.
#include "tensorflow/compiler/jit/flags.h"  // DisableXlaCompilation()
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/protobuf/meta_graph.pb.h"
#include "tensorflow/core/public/session.h"

namespace {

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) { out.push_back(cur); cur.clear(); } else cur += c;
  }
  out.push_back(cur);
  return out;
}

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      case '\r': o += "\\r"; break;
      default:
        if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); o += b; }
        else o += c;
    }
  }
  return o;
}

struct InputSpec { std::string name, dtype, shape, values; };

bool ParseSpec(std::string line, InputSpec* spec, std::string* err) {
  // Accept "a:b:c:d" or whitespace separated "a b c d".
  if (line.find(':') == std::string::npos) {
    std::istringstream is(line);
    std::vector<std::string> f; std::string t;
    while (is >> t) f.push_back(t);
    if (f.size() < 3 || f.size() > 4) { *err = "bad input line: " + line; return false; }
    if (f.size() == 3) f.push_back("");
    *spec = {f[0], f[1], f[2], f[3]};
    // allow "[]" or "scalar" for scalars
    if (spec->shape == "[]" || spec->shape == "scalar") spec->shape = "";
    return true;
  }
  auto p = line.find(':'); spec->name = line.substr(0, p); line = line.substr(p + 1);
  p = line.find(':'); if (p == std::string::npos) { *err = "bad spec"; return false; }
  spec->dtype = line.substr(0, p); line = line.substr(p + 1);
  p = line.find(':'); if (p == std::string::npos) { *err = "bad spec"; return false; }
  spec->shape = line.substr(0, p); spec->values = line.substr(p + 1);
  if (spec->shape == "[]" || spec->shape == "scalar") spec->shape = "";
  return true;
}

template <typename T, typename F>
bool Fill(tensorflow::Tensor* t, const std::vector<std::string>& vals, F conv) {
  auto flat = t->flat<T>();
  for (size_t i = 0; i < vals.size(); ++i) flat(i) = conv(vals[i]);
  return true;
}

bool BuildTensor(const InputSpec& s, tensorflow::Tensor* out, std::string* err) {
  using namespace tensorflow;
  std::vector<int64_t> dims;
  if (!s.shape.empty())
    for (auto& d : Split(s.shape, ',')) dims.push_back(std::stoll(d));
  TensorShape shape;
  for (auto d : dims) shape.AddDim(d);
  std::vector<std::string> vals;
  if (!s.values.empty()) vals = Split(s.values, ',');
  if ((int64_t)vals.size() != shape.num_elements()) {
    *err = "input '" + s.name + "': " + std::to_string(vals.size()) +
           " values for shape " + shape.DebugString();
    return false;
  }
  try {
    if (s.dtype == "int32") {
      *out = Tensor(DT_INT32, shape);
      Fill<int32_t>(out, vals, [](const std::string& v) { return (int32_t)std::stol(v); });
    } else if (s.dtype == "int64") {
      *out = Tensor(DT_INT64, shape);
      Fill<int64_t>(out, vals, [](const std::string& v) { return (int64_t)std::stoll(v); });
    } else if (s.dtype == "float32" || s.dtype == "float") {
      *out = Tensor(DT_FLOAT, shape);
      Fill<float>(out, vals, [](const std::string& v) { return std::stof(v); });
    } else if (s.dtype == "float64" || s.dtype == "double") {
      *out = Tensor(DT_DOUBLE, shape);
      Fill<double>(out, vals, [](const std::string& v) { return std::stod(v); });
    } else if (s.dtype == "bool") {
      *out = Tensor(DT_BOOL, shape);
      Fill<bool>(out, vals, [](const std::string& v) { return v == "1" || v == "true"; });
    } else if (s.dtype == "string") {
      *out = Tensor(DT_STRING, shape);
      Fill<tstring>(out, vals, [](const std::string& v) { return tstring(v); });
    } else {
      *err = "unsupported dtype: " + s.dtype;
      return false;
    }
  } catch (const std::exception& e) {
    *err = "input '" + s.name + "': bad value (" + e.what() + ")";
    return false;
  }
  return true;
}

void AppendFloat(std::string* o, double v, int prec) {
  if (std::isnan(v)) { *o += "\"NaN\""; return; }
  if (std::isinf(v)) { *o += v > 0 ? "\"Infinity\"" : "\"-Infinity\""; return; }
  char b[64]; snprintf(b, sizeof b, "%.*g", prec, v); *o += b;
}

std::string ToJson(const std::string& name, const tensorflow::Tensor& t) {
  using namespace tensorflow;
  std::string o = "{\"name\":\"" + JsonEscape(name) + "\",\"dtype\":\"";
  std::string dt;
  switch (t.dtype()) {
    case DT_FLOAT: dt = "float32"; break;
    case DT_DOUBLE: dt = "float64"; break;
    case DT_INT32: dt = "int32"; break;
    case DT_INT64: dt = "int64"; break;
    case DT_BOOL: dt = "bool"; break;
    case DT_STRING: dt = "string"; break;
    default: dt = DataTypeString(t.dtype());
  }
  o += dt + "\",\"shape\":[";
  for (int i = 0; i < t.dims(); ++i) { if (i) o += ","; o += std::to_string(t.dim_size(i)); }
  o += "],\"values\":[";
  const int64_t n = t.NumElements();
  for (int64_t i = 0; i < n; ++i) {
    if (i) o += ",";
    switch (t.dtype()) {
      case DT_FLOAT: AppendFloat(&o, t.flat<float>()(i), 9); break;
      case DT_DOUBLE: AppendFloat(&o, t.flat<double>()(i), 17); break;
      case DT_INT32: o += std::to_string(t.flat<int32_t>()(i)); break;
      case DT_INT64: o += std::to_string(t.flat<int64_t>()(i)); break;
      case DT_BOOL: o += t.flat<bool>()(i) ? "true" : "false"; break;
      case DT_STRING: o += "\"" + JsonEscape(std::string(t.flat<tstring>()(i))) + "\""; break;
      default: o += "null";
    }
  }
  o += "]}";
  return o;
}

int Fail(const std::string& msg) {
  std::cerr << "ERROR: " << msg << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  bool xla_on = false;
  int repeat = 0;      // timed runs after the first (benchmarks)
  long evict_mib = 0;  // scratch written before each repeated run (cold caches)
  std::string tags_arg = "serve";  // kSavedModelTagServe
  std::string sig_name = "serving_default";
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--xla=on") xla_on = true;
    else if (a == "--xla=off") xla_on = false;
    else if (a.rfind("--tags=", 0) == 0) tags_arg = a.substr(7);
    else if (a.rfind("--repeat=", 0) == 0) repeat = std::stoi(a.substr(9));
    else if (a.rfind("--evict_mib=", 0) == 0) evict_mib = std::stol(a.substr(12));
    else if (a.rfind("--signature=", 0) == 0) sig_name = a.substr(12);
    else if (a.rfind("--", 0) == 0) return Fail("unknown flag " + a);
    else pos.push_back(a);
  }
  if (pos.size() < 2)
    return Fail("usage: savedmodel_runner [--xla=off|on] [--tags=serve] "
                "[--signature=serving_default] <export_dir> "
                "<inputs_file | name:dtype:shape:values ...>");
  const std::string export_dir = pos[0];

  // Collect input specs: if 2nd positional is an existing file, read it.
  std::vector<InputSpec> specs;
  std::string err;
  {
    std::ifstream f(pos[1]);
    if (pos.size() == 2 && f.good() && pos[1].find(':') == std::string::npos) {
      std::string line;
      while (std::getline(f, line)) {
        auto b = line.find_first_not_of(" \t\r");
        if (b == std::string::npos || line[b] == '#') continue;
        InputSpec s;
        if (!ParseSpec(line.substr(b), &s, &err)) return Fail(err);
        specs.push_back(s);
      }
    } else {
      for (size_t i = 1; i < pos.size(); ++i) {
        InputSpec s;
        if (!ParseSpec(pos[i], &s, &err)) return Fail(err);
        specs.push_back(s);
      }
    }
  }

  // TF Serving default: XLA JIT compilation disabled (opt-in only).
  if (!xla_on) tensorflow::DisableXlaCompilation();

  tensorflow::SessionOptions session_options;
  tensorflow::RunOptions run_options;
  std::unordered_set<std::string> tags;
  for (auto& t : Split(tags_arg, ',')) if (!t.empty()) tags.insert(t);

  tensorflow::SavedModelBundle bundle;
  auto t0 = std::chrono::steady_clock::now();
  absl::Status st = tensorflow::LoadSavedModel(session_options, run_options,
                                                     export_dir, tags, &bundle);
  auto t1 = std::chrono::steady_clock::now();
  double load_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  std::cerr << "{\"load_time_ms\":" << load_ms << "}" << std::endl;
  if (!st.ok()) return Fail("LoadSavedModel: " + st.ToString());

  const auto& sigs = bundle.meta_graph_def.signature_def();
  auto it = sigs.find(sig_name);
  if (it == sigs.end()) return Fail("signature '" + sig_name + "' not found");
  const tensorflow::SignatureDef& sig = it->second;

  std::vector<std::pair<std::string, tensorflow::Tensor>> feeds;
  for (const auto& s : specs) {
    auto in = sig.inputs().find(s.name);
    if (in == sig.inputs().end()) {
      std::string known;
      for (auto& kv : sig.inputs()) known += " " + kv.first;
      return Fail("input '" + s.name + "' not in signature; inputs:" + known);
    }
    tensorflow::Tensor t;
    if (!BuildTensor(s, &t, &err)) return Fail(err);
    feeds.emplace_back(in->second.name(), t);
  }
  if (feeds.size() != (size_t)sig.inputs().size())
    return Fail("signature expects " + std::to_string(sig.inputs().size()) +
                " inputs, got " + std::to_string(feeds.size()));

  std::map<std::string, std::string> outs;  // sorted by output key
  for (auto& kv : sig.outputs()) outs[kv.first] = kv.second.name();
  std::vector<std::string> out_keys, out_names;
  for (auto& kv : outs) { out_keys.push_back(kv.first); out_names.push_back(kv.second); }

  std::vector<tensorflow::Tensor> results;
  auto t2 = std::chrono::steady_clock::now();
  st = bundle.session->Run(run_options, feeds, out_names, {}, &results, nullptr);
  auto t3 = std::chrono::steady_clock::now();
  std::cerr << "{\"run_time_ms\":"
            << std::chrono::duration<double, std::milli>(t3 - t2).count() << "}"
            << std::endl;
  if (!st.ok()) return Fail("Session::Run: " + st.ToString());

  // Repeated runs, as a server answers requests: each after `evict_mib` of
  // scratch writes (what a model's forward pass leaves in the caches).
  if (repeat > 0) {
    std::vector<double> scratch(evict_mib * (1 << 20) / sizeof(double), 0.0);
    std::string times = "{\"repeat_times_ms\":[";
    for (int r = 0; r < repeat; ++r) {
      for (double& x : scratch) x += 1.0;
      std::vector<tensorflow::Tensor> again;
      auto a = std::chrono::steady_clock::now();
      st = bundle.session->Run(run_options, feeds, out_names, {}, &again, nullptr);
      auto b = std::chrono::steady_clock::now();
      if (!st.ok()) return Fail("Session::Run: " + st.ToString());
      times += (r ? "," : "") +
               std::to_string(std::chrono::duration<double, std::milli>(b - a).count());
    }
    std::cerr << times << "]}" << std::endl;
  }

  for (size_t i = 0; i < results.size(); ++i)
    std::cout << ToJson(out_keys[i], results[i]) << "\n";
  std::cout.flush();
  return 0;
}
