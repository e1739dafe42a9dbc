// `distopt config reference`: every key of the job file, from the tables the
// parser validates with (distopt/key_schema.hpp), the inner optimizers'
// schemas, every discovered component's options, and the built-in models'
// parameter names and shapes (built here, so they are the trained ones).
// share/doc/distopt/REFERENCE.md is its markdown output (tools/gen_reference.sh).
#include <algorithm>
#include <boost/program_options.hpp>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "distopt/component_options.hpp"
#include "distopt/config.hpp"
#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "distopt/key_schema.hpp"
#include "distopt/registry.hpp"
#include "distopt/sdk/optim/optimizer_schema.hpp"
#include "train/dataset.hpp"
#include "train/models.hpp"

namespace po = boost::program_options;

namespace {

using Rows = std::vector<std::vector<std::string>>;

/// Markdown or plain text: headings, paragraphs, tables (first row = header).
class Writer {
 public:
  Writer(std::ostream& os, bool markdown) : os_(os), md_(markdown) {}

  void heading(int level, const std::string& text) {
    if (md_)
      os_ << "\n" << std::string(level, '#') << " " << text << "\n\n";
    else
      os_ << "\n" << text << "\n" << std::string(text.size(), level <= 2 ? '=' : '-') << "\n";
  }
  void para(const std::string& text) { os_ << text << "\n" << (md_ ? "\n" : ""); }
  void table(const Rows& rows) {
    if (md_) {
      for (size_t r = 0; r < rows.size(); ++r) {
        os_ << "|";
        for (const auto& c : rows[r]) os_ << " " << cell(c) << " |";
        os_ << "\n";
        if (r == 0) {
          os_ << "|";
          for (size_t i = 0; i < rows[0].size(); ++i) os_ << " --- |";
          os_ << "\n";
        }
      }
      os_ << "\n";
      return;
    }
    std::vector<size_t> w(rows.empty() ? 0 : rows[0].size(), 0);
    for (const auto& r : rows)
      for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
    for (const auto& r : rows) {
      std::string line = "  ";
      for (size_t i = 0; i < r.size(); ++i)
        line += i + 1 < r.size() ? r[i] + std::string(w[i] - r[i].size() + 2, ' ') : r[i];
      os_ << line << "\n";
    }
  }
  /// `text` as code in markdown, as is in text.
  std::string code(const std::string& text) const { return md_ ? "`" + text + "`" : text; }

 private:
  // '|' ends a markdown table cell; GFM takes "\|" as the character.
  static std::string cell(const std::string& s) {
    std::string out;
    for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
  }
  std::ostream& os_;
  bool md_;
};

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

Rows option_rows(const std::vector<distopt::OptionSpec>& specs) {
  Rows rows = {{"option", "type", "default", "range / values", "help"}};
  for (const auto& s : specs)
    rows.push_back({s.name, distopt::option_type_name(s.type),
                    s.default_value ? *s.default_value : "(required)",
                    s.choices.empty() ? s.range_text() : join(s.choices, "|"), s.help});
  return rows;
}

void write_sections(Writer& w) {
  w.heading(2, "Job file");
  w.para(
      "Every key the host validates; an unknown key, a wrong type or a value out of range is an "
      "error naming the file, line and column, the key, and the valid keys. Ranges are "
      "intervals (`(0, 1]` excludes 0); integers without a bound stop at 2^40.");
  for (const auto& s : distopt::config_sections()) {
    const std::string path = s.path;
    w.heading(3, path == "the top level" ? "Top level" : w.code(path));
    w.para(s.summary);
    Rows rows = {{"key", "type", "default", "range / values", "help"}};
    for (const auto& k : s.keys) rows.push_back({k.key, k.type, k.default_value, k.range, k.help});
    w.table(rows);
    if (path != "optimizer") continue;
    for (const char* name : {"sgd", "adam", "adamw", "adagrad", "rmsprop"}) {
      w.heading(4, w.code("optimizer: {name: " + std::string(name) + "}"));
      w.table(option_rows(distopt::optimizer_option_specs(name)));
    }
  }
}

const char* kind_title(dopt_component_kind k) {
  switch (k) {
    case DOPT_KIND_COMMUNICATOR:
      return "Communicators (`communicator:`, `control_communicator:`)";
    case DOPT_KIND_REDUCER:
      return "Reducers (`reducer:`, `reducer.inner:`)";
    case DOPT_KIND_ALGORITHM:
      return "Algorithms (`algorithm:`)";
  }
  return "?";
}

void write_components(Writer& w, const distopt::PluginRegistry& reg) {
  w.heading(2, "Components");
  w.para(
      "What plugin discovery found where this was generated (`distopt plugins` lists what your "
      "installation finds). A section's `options:` are checked against the component's schema.");
  std::vector<const distopt::ComponentInfo*> all;
  for (const auto& c : reg.components()) all.push_back(&c);
  std::sort(all.begin(), all.end(), [](const auto* a, const auto* b) {
    return a->kind != b->kind ? a->kind < b->kind : a->name < b->name;
  });
  for (dopt_component_kind kind :
       {DOPT_KIND_COMMUNICATOR, DOPT_KIND_REDUCER, DOPT_KIND_ALGORITHM}) {
    w.heading(3, kind_title(kind));
    for (const auto* c : all) {
      if (c->kind != kind) continue;
      w.heading(4, w.code(c->name) + " (plugin " + c->plugin_name + " " + c->plugin_version + ")");
      std::vector<std::string> decl;
      if (c->traits & DOPT_TRAIT_EXACT_MEAN) decl.push_back("reduces to the exact mean");
      if (c->traits & DOPT_TRAIT_WRAPS_REDUCER) decl.push_back("wraps an `inner:` reducer");
      if (c->check_job) decl.push_back("checks the whole job at `distopt check`");
      if (c->devices != DOPT_DEVICES_DEFAULT)
        decl.push_back("memory on " + distopt::devices_text(c->devices));
      w.para(c->description + (decl.empty() ? "" : " (" + join(decl, "; ") + ")"));
      if (c->options.empty())
        w.para("No options of its own.");
      else
        w.table(option_rows(c->options));
    }
    if (kind == DOPT_KIND_REDUCER) {
      w.heading(4, "Bucketing options (every reducer)");
      w.para(
          "Written in the reducer's `options:`, read by the host's bucket manager (core), "
          "which packs the gradients into buckets and launches each; the reducer never sees "
          "them.");
      w.table(option_rows(distopt::bucket_option_specs()));
    }
  }
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::vector<std::string> d;
  for (int64_t v : s) d.push_back(std::to_string(v));
  return "[" + join(d, ", ") + "]";
}

// Parameters and buffers in the order of Module::named_parameters /
// named_buffers (the names of the consolidated checkpoint's "model" dict).
Rows tensor_rows(const torch::nn::Module& m) {
  Rows rows = {{"name", "shape"}};
  for (const auto& p : m.named_parameters())
    rows.push_back({p.key(), shape_text(p.value().sizes().vec())});
  for (const auto& b : m.named_buffers())
    rows.push_back({b.key() + " (buffer)", shape_text(b.value().sizes().vec())});
  return rows;
}

// resnet's shapes for any width W: build it at W = 8 and 16 and write each
// dimension that doubles as a multiple of W.
Rows resnet_rows(int64_t channels, int64_t classes) {
  auto a = distopt::train::make_model("resnet", channels, 32, 32, classes, 0, 8);
  auto b = distopt::train::make_model("resnet", channels, 32, 32, classes, 0, 16);
  Rows rows = {{"name", "shape"}};
  auto pb = b->named_parameters();
  for (const auto& p : a->named_parameters()) {
    const auto s8 = p.value().sizes().vec(), s16 = pb[p.key()].sizes().vec();
    std::vector<std::string> d;
    for (size_t i = 0; i < s8.size(); ++i) {
      if (s16[i] == 2 * s8[i] && s8[i] % 8 == 0)
        d.push_back(s8[i] == 8 ? "W" : std::to_string(s8[i] / 8) + "W");
      else
        d.push_back(std::to_string(s8[i]));
    }
    rows.push_back({p.key(), "[" + join(d, ", ") + "]"});
  }
  return rows;
}

void write_models(Writer& w) {
  using distopt::train::make_model;
  using distopt::train::parameter_count;
  w.heading(2, "Built-in models (`train.model`) and datasets (`train.dataset`)");
  w.para(
      "`distopt checkpoint consolidate` writes `{\"model\": {name: tensor}, ...}`; the names "
      "and shapes below are those keys, so a PyTorch module with the same layers and names "
      "loads it with `load_state_dict`. Inputs are images [B, C, H, W]; Fashion-MNIST pixels are "
      "scaled to "
      "[0, 1], then normalised with mean 0.2860 and std 0.3530.");
  w.heading(3, "Datasets");
  w.table({{"dataset", "images", "classes", "samples"},
           {"fashion-mnist", "[1, 28, 28]", "10",
            "60000 train, 10000 test, from train.data_dir (train-images-idx3-ubyte[.gz], "
            "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte)"},
           {"synthetic", "[channels, height, width] (default [3, 32, 32])", "classes (10)",
            "train_samples, test_samples (50000, 10000), generated from the index and seed"}});
  struct Input {
    const char* what;
    int64_t c, h, wd;
  };
  const Input inputs[] = {{"fashion-mnist, [1, 28, 28]", 1, 28, 28},
                          {"synthetic defaults, [3, 32, 32]", 3, 32, 32}};
  w.heading(3, w.code("mlp"));
  w.para(
      "flatten -> Linear(C*H*W, 512) -> ReLU -> Linear(512, 256) -> ReLU -> Linear(256, "
      "classes). Torch's nn.Linear weights are [out, in].");
  for (const auto& in : inputs) {
    auto m = make_model("mlp", in.c, in.h, in.wd, 10, 0, 8);
    w.para("For " + std::string(in.what) + ", 10 classes (" + std::to_string(parameter_count(*m)) +
           " parameters):");
    w.table(tensor_rows(*m));
  }
  w.heading(3, w.code("cnn"));
  w.para(
      "Conv2d(C, 16, 5, padding 2) -> ReLU -> MaxPool2d(2) -> Conv2d(16, 32, 5, padding 2) -> "
      "ReLU -> MaxPool2d(2) -> flatten -> Linear(32*(H/4)*(W/4), 128) -> ReLU -> Linear(128, "
      "classes).");
  for (const auto& in : inputs) {
    auto m = make_model("cnn", in.c, in.h, in.wd, 10, 0, 8);
    w.para("For " + std::string(in.what) + ", 10 classes (" + std::to_string(parameter_count(*m)) +
           " parameters):");
    w.table(tensor_rows(*m));
  }
  w.heading(3, w.code("resnet"));
  w.para(
      "ResNet-18 for small images (the CIFAR variant: 3x3 stem, no max pool), W = "
      "`train.model_width` (0: 8 on the CPU, 64 on a GPU). stem: Conv2d(C, W, 3, padding 1, no "
      "bias) -> GroupNorm(gcd(8, W), W) (stem_gn) -> ReLU; then layer1_0 ... layer4_1, two "
      "BasicBlocks per stage with W, 2W, 4W, 8W channels, the first block of stages 2-4 with "
      "stride 2. A BasicBlock: conv1 (3x3, stride, padding 1, no bias) -> gn1 -> ReLU -> conv2 "
      "(3x3, padding 1, no bias) -> gn2, plus the input, through down (1x1, stride, no bias) -> "
      "down_gn where the shape changes; then ReLU. Then the mean over H and W and fc = "
      "Linear(8W, classes). GroupNorm has no buffers. Any image size >= 8x8; the shapes do not "
      "depend on it.");
  for (int64_t c : {1, 3}) {
    auto m8 = make_model("resnet", c, 32, 32, 10, 0, 8);
    auto m64 = make_model("resnet", c, 32, 32, 10, 0, 64);
    w.para("For C = " + std::to_string(c) + ", 10 classes (" +
           std::to_string(parameter_count(*m8)) + " parameters at W = 8, " +
           std::to_string(parameter_count(*m64)) + " at W = 64):");
    w.table(resnet_rows(c, 10));
  }
}

int run_reference(int argc, char** argv) {
  po::options_description desc(
      "usage: distopt config reference [--plugin-path DIR]... [--format markdown|text]\n\n"
      "Print every key of the job file (type, default, range, help), every inner optimizer's\n"
      "options, every discovered component's options, and the built-in models' parameter\n"
      "names and shapes.\n\noptions");
  std::string format = "text";
  desc.add_options()("help,h", "show this help")(
      "plugin-path,P", po::value<std::vector<std::string>>()->composing(),
      "search DIR first (repeatable)")("format", po::value(&format)->default_value("text"),
                                       "markdown (share/doc/distopt/REFERENCE.md) or text");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "distopt config reference: " << e.what() << "\n\n" << desc << "\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (format != "markdown" && format != "text") {
    std::cerr << "distopt config reference: --format '" << format
              << "' is not one of markdown|text\n";
    return 2;
  }
  std::vector<std::string> cli_paths;
  if (vm.count("plugin-path")) cli_paths = vm["plugin-path"].as<std::vector<std::string>>();
  distopt::set_log_level(DOPT_LOG_ERROR);  // skipped files are `distopt plugins`' business
  distopt::PluginRegistry reg;
  reg.discover(distopt::PluginRegistry::search_path(cli_paths, {}));

  std::ostringstream out;  // nothing printed if a model fails to build
  Writer w(out, format == "markdown");
  if (format == "markdown") {
    out << "# distopt configuration reference\n\n"
        << "<!-- Generated by `distopt config reference --format markdown` "
           "(tools/gen_reference.sh); do not edit. -->\n\n"
        << "The job file's sections and keys, the inner optimizers, the components of this "
           "tree, and the built-in models. The [user guide](GUIDE.md) shows them at work.\n";
  } else {
    out << "distopt configuration reference\n";
  }
  write_sections(w);
  write_components(w, reg);
  write_models(w);
  // Headings and paragraphs each add a blank line: keep one between blocks.
  std::string text = out.str();
  for (size_t at; (at = text.find("\n\n\n")) != std::string::npos;) text.erase(at, 1);
  std::cout << text;
  return 0;
}

int run_config(int argc, char** argv) {
  const char* usage =
      "usage: distopt config reference [--plugin-path DIR]... [--format markdown|text]\n\n"
      "  reference   every job-file key, optimizer option, component option and built-in model\n";
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    (argc < 2 ? std::cerr : std::cout) << usage;
    return argc < 2 ? 2 : 0;
  }
  if (std::string(argv[1]) != "reference") {
    std::cerr << "distopt config: unknown subcommand '" << argv[1] << "'\n" << usage;
    return 2;
  }
  std::string prog = "distopt config reference";
  argv[1] = prog.data();
  return run_reference(argc - 1, argv + 1);
}

}  // namespace

DISTOPT_REGISTER_COMMAND("config", "print the reference of every job-file key and component option",
                         run_config);
