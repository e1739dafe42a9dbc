// The Python extension `distopt._distopt`: the embedding API (Runtime,
// DistributedOptimizer, checkpoints) for PyTorch scripts. The Python
// package (distopt/__init__.py) shapes it as PyTorch users expect.
//
// Tensors cross as torch's own (torch/extension.h's casters), so a Python
// parameter and the tensor the optimizer holds are one TensorImpl: the
// optimizer's gradient hooks run inside loss.backward() and its updates are
// what the Python model sees.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distopt/checkpoint.hpp"
#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/runtime.hpp"
#include "distopt/sharded_unit.hpp"
#include "process_group.hpp"

namespace py = pybind11;

namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

// The child of `m` named `name`, created empty if missing.
torch::nn::Module& child(torch::nn::Module& m, const std::string& name) {
  for (auto& c : m.named_children())
    if (c.key() == name) return *c.value();
  return *m.register_module(name, std::make_shared<torch::nn::Module>());
}

// The tensors of one Python submodule that is a unit of parameter sharding:
// wrapped in a distopt::ShardedUnit, whose hooks the Python module's forward
// hooks call (Python modules have hooks; this forward never runs).
struct UnitTensorsImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) { return x; }
};

// A C++ module tree holding the Python model's tensors under their dotted
// names ("body.0.weight"), for the calls that take a torch::nn::Module
// (make_optimizer's buffers and units, checkpoints, consolidate). The
// submodules named in `units` (module paths, none inside another) become
// ShardedUnits, returned in `wrappers` in that order.
std::shared_ptr<torch::nn::Module> module_of(
    const Named& params, const Named& buffers, const std::vector<std::string>& units,
    std::vector<std::shared_ptr<distopt::ShardedUnitImpl>>* wrappers) {
  for (const auto& a : units)
    for (const auto& b : units)
      if (a.empty() || (&a != &b && (a == b || b.rfind(a + ".", 0) == 0)))
        throw distopt::Error("units: '" + a + "' and '" + b +
                             "' overlap (or one is empty); name submodules none of which "
                             "holds another");
  auto root = std::make_shared<torch::nn::Module>();
  std::vector<std::shared_ptr<UnitTensorsImpl>> holders;
  for (size_t u = 0; u < units.size(); ++u) holders.push_back(std::make_shared<UnitTensorsImpl>());
  auto place = [&](std::string name, const at::Tensor& t, bool parameter) {
    torch::nn::Module* m = root.get();
    for (size_t u = 0; u < units.size(); ++u)
      if (name.rfind(units[u] + ".", 0) == 0) {
        m = holders[u].get();
        name = name.substr(units[u].size() + 1);
        break;
      }
    size_t start = 0;
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
      m = &child(*m, name.substr(start, dot - start));
      start = dot + 1;
    }
    const std::string leaf = name.substr(start);
    if (parameter)
      m->register_parameter(leaf, t, t.requires_grad());
    else
      m->register_buffer(leaf, t);
  };
  for (const auto& [n, t] : params) place(n, t, true);
  for (const auto& [n, t] : buffers) place(n, t, false);
  for (size_t u = 0; u < units.size(); ++u) {
    auto wrapper = std::make_shared<distopt::ShardedUnitImpl>(holders[u]);
    torch::nn::Module* parent = root.get();
    const std::string& path = units[u];
    size_t start = 0;
    for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
      parent = &child(*parent, path.substr(start, dot - start));
      start = dot + 1;
    }
    parent->register_module(path.substr(start), wrapper);
    wrappers->push_back(wrapper);
  }
  return root;
}

// The optimizer with the module tree it was built on.
struct PyOptimizer {
  PyOptimizer(distopt::Runtime r, std::shared_ptr<torch::nn::Module> m,
              distopt::DistributedOptimizer o)
      : rt(std::move(r)), module(std::move(m)), opt(std::move(o)) {}
  distopt::Runtime rt;
  std::shared_ptr<torch::nn::Module> module;
  distopt::DistributedOptimizer opt;
  std::unique_ptr<distopt::DistributedOptimizer::NoSync> no_sync;           // inside opt.no_sync()
  std::vector<std::shared_ptr<distopt::ShardedUnitImpl>> units;             // in the caller's order
  std::unique_ptr<distopt::DistributedOptimizer::GatheredParams> gathered;  // gather_params()
  const distopt::UnitSlot& slot(size_t i) const {
    if (i >= units.size()) throw distopt::Error("no unit " + std::to_string(i));
    return *units[i]->slot();
  }
};

std::map<std::string, std::string> info_dict(const distopt::CheckpointInfo& i) {
  std::map<std::string, std::string> d = i.extra;
  d["path"] = i.path;
  d["step"] = std::to_string(i.step);
  d["world_size"] = std::to_string(i.world_size);
  d["algorithm"] = i.algorithm;
  d["reducer"] = i.reducer;
  d["optimizer"] = i.optimizer;
  return d;
}

}  // namespace

PYBIND11_MODULE(_distopt, m) {
  m.doc() = "distopt's runtime and distributed optimizer (see the package distopt)";
  // distopt's errors as Python exceptions of one base class.
  static py::exception<distopt::Error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const distopt::Error& e) {
      PyErr_SetString(error.ptr(), e.what());  // pybind11 >= 2.12 deprecates error(what)
    }
  });

  // The torch.distributed backend (process_group.hpp); distopt/__init__.py
  // registers it under the name "distopt".
  using distopt::python::BackendOptions;
  py::class_<BackendOptions>(m, "BackendOptions")
      .def(py::init<>())
      .def_readwrite("communicator", &BackendOptions::communicator)
      .def_readwrite("options", &BackendOptions::options)
      .def_readwrite("cuda_communicator", &BackendOptions::cuda_communicator)
      .def_readwrite("cuda_options", &BackendOptions::cuda_options)
      .def_readwrite("plugin_paths", &BackendOptions::plugin_paths)
      .def_readwrite("collective_check_s", &BackendOptions::collective_check_s);
  m.def(
      "create_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
         std::chrono::milliseconds timeout, const BackendOptions& options) {
        py::gil_scoped_release nogil;
        return distopt::python::make_process_group(store, rank, world_size, timeout, options);
      },
      py::arg("store"), py::arg("rank"), py::arg("world_size"), py::arg("timeout"),
      py::arg("options"));
  m.def(
      "drain_callbacks",
      [](double seconds) {
        py::gil_scoped_release nogil;
        distopt::python::drain_callbacks(
            std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
      },
      py::arg("seconds") = 10.0);

  py::class_<distopt::Runtime>(m, "Runtime")
      .def_static(
          "from_yaml",
          [](const std::string& path) {
            py::gil_scoped_release nogil;
            return distopt::Runtime::from_yaml(path);
          },
          py::arg("path"))
      .def_static(
          "from_text",
          [](const std::string& text, const std::string& name) {
            distopt::JobConfig cfg = distopt::parse_job_config(text, name);
            py::gil_scoped_release nogil;
            return distopt::Runtime::from_config(cfg);
          },
          py::arg("text"), py::arg("name") = "<string>")
      .def_property_readonly("rank", &distopt::Runtime::rank)
      .def_property_readonly("world_size", &distopt::Runtime::world_size)
      .def_property_readonly("local_rank", &distopt::Runtime::local_rank)
      .def(
          "allreduce",
          [](distopt::Runtime& rt, at::Tensor t, bool average) {
            py::gil_scoped_release nogil;
            rt.allreduce(t, average);
          },
          py::arg("tensor"), py::arg("average") = false)
      .def(
          "broadcast",
          [](distopt::Runtime& rt, const std::vector<at::Tensor>& ts, int root) {
            py::gil_scoped_release nogil;
            rt.broadcast(ts, root);
          },
          py::arg("tensors"), py::arg("root") = 0)
      .def("barrier", [](distopt::Runtime& rt) {
        py::gil_scoped_release nogil;
        rt.barrier();
      });

  py::class_<PyOptimizer>(m, "DistributedOptimizer")
      .def(py::init([](distopt::Runtime& rt, const Named& params, const Named& buffers,
                       const std::vector<std::string>& units) {
             std::vector<std::shared_ptr<distopt::ShardedUnitImpl>> wrappers;
             auto module = module_of(params, buffers, units, &wrappers);
             py::gil_scoped_release nogil;
             distopt::DistributedOptimizer opt = rt.make_optimizer(*module);
             auto o = std::make_unique<PyOptimizer>(rt, module, std::move(opt));
             o->units = std::move(wrappers);
             return o;
           }),
           py::arg("runtime"), py::arg("named_parameters"), py::arg("named_buffers"),
           py::arg("units") = std::vector<std::string>{})
      .def_property_readonly("shards_parameters",
                             [](const PyOptimizer& o) { return o.opt.shards_parameters(); })
      .def("unit_before",
           [](PyOptimizer& o, size_t i) {
             const distopt::UnitSlot& s = o.slot(i);
             py::gil_scoped_release nogil;
             if (s.hooks) s.hooks->before_forward(s.unit);
           })
      .def(
          "unit_after",
          [](PyOptimizer& o, size_t i, std::optional<at::Tensor> out) {
            const distopt::UnitSlot& s = o.slot(i);
            py::gil_scoped_release nogil;
            if (s.hooks) s.hooks->after_forward(s.unit, out ? *out : at::Tensor());
          },
          py::arg("unit"), py::arg("output"))
      .def("enter_gather",
           [](PyOptimizer& o) {
             if (o.gathered) throw distopt::Error("gather_params(): already inside one");
             py::gil_scoped_release nogil;
             o.gathered = std::make_unique<distopt::DistributedOptimizer::GatheredParams>(o.opt);
           })
      .def("exit_gather",
           [](PyOptimizer& o) {
             py::gil_scoped_release nogil;
             o.gathered.reset();
           })
      .def("zero_grad", [](PyOptimizer& o) { o.opt.zero_grad(); })
      .def("step",
           [](PyOptimizer& o) {
             py::gil_scoped_release nogil;
             o.opt.step();
           })
      .def("join",
           [](PyOptimizer& o) {
             py::gil_scoped_release nogil;
             return o.opt.join();
           })
      .def("enter_no_sync",
           [](PyOptimizer& o) {
             if (o.no_sync)
               throw distopt::Error("no_sync(): already inside one (they do not nest)");
             o.no_sync = std::make_unique<distopt::DistributedOptimizer::NoSync>(o.opt);
           })
      .def("exit_no_sync", [](PyOptimizer& o) { o.no_sync.reset(); })
      .def(
          "lr", [](const PyOptimizer& o, int group) { return o.opt.lr(group); },
          py::arg("group") = 0)
      .def(
          "set_lr", [](PyOptimizer& o, double lr, int group) { o.opt.set_lr(lr, group); },
          py::arg("lr"), py::arg("group") = 0)
      .def("scale_loss",
           [](const PyOptimizer& o, const at::Tensor& l) { return o.opt.scale_loss(l); })
      .def_property_readonly("loss_scale", [](const PyOptimizer& o) { return o.opt.loss_scale(); })
      .def_property_readonly("steps", [](const PyOptimizer& o) { return o.opt.steps(); })
      .def_property_readonly("bytes_sent", [](const PyOptimizer& o) { return o.opt.bytes_sent(); })
      .def_property_readonly("state_bytes",
                             [](const PyOptimizer& o) { return o.opt.state_bytes(); })
      .def_property_readonly("num_buckets",
                             [](const PyOptimizer& o) { return o.opt.num_buckets(); })
      .def_property_readonly("algorithm",
                             [](const PyOptimizer& o) { return o.opt.algorithm_name(); })
      .def_property_readonly("reducer", [](const PyOptimizer& o) { return o.opt.reducer_name(); })
      .def(
          "save_checkpoint",
          [](PyOptimizer& o, const std::string& dir,
             const std::map<std::string, std::string>& extra, int keep) {
            py::gil_scoped_release nogil;
            return info_dict(o.rt.save_checkpoint(dir, *o.module, o.opt, extra, keep));
          },
          py::arg("dir"), py::arg("extra") = std::map<std::string, std::string>{},
          py::arg("keep") = 2)
      .def(
          "load_checkpoint",
          [](PyOptimizer& o, const std::string& dir) {
            py::gil_scoped_release nogil;
            return info_dict(o.rt.load_checkpoint(dir, *o.module, o.opt));
          },
          py::arg("dir"))
      .def(
          "consolidate",
          [](PyOptimizer& o, int to) {
            std::map<std::string, at::Tensor> all;
            {
              py::gil_scoped_release nogil;
              all = o.rt.consolidate(*o.module, o.opt, to);
            }
            return all;
          },
          py::arg("to") = 0);
}
