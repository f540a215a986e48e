// spillarena.SpillArena, its options and stats, and the sizing helpers.
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include "binding.h"
#include "fields.h"
#include "spill/arena.h"
#include "spill/directory.h"
#include "spill/io.h"
#include "spill/process_memory.h"
#include "spill/sizing.h"
#include "spill/stash.h"
#include "spill/units.h"

namespace spillarena_python {

namespace {

// Keyword spellings of earlier releases, accepted with a DeprecationWarning.
std::string current_option_name(const std::string& key) {
  if (key != "allow_ram_backed_directory") return key;
  if (PyErr_WarnEx(PyExc_DeprecationWarning,
                   "spillarena: allow_ram_backed_directory is now allow_memory_backed_directory",
                   1) != 0) {
    throw py::error_already_set();
  }
  return "allow_memory_backed_directory";
}

// Note [Options the arena does not use]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Some options mean nothing for the backing or I/O mode asked for: the RAM backing has no
// directory and no disk I/O, direct I/O no page cache, buffered I/O no staging pool. Given there,
// they would be ignored silently; a UserWarning names them instead (the arena is still made, as
// the CLI does: see Note [Options a mode does not use] in tools/cli/train_command.cc).
std::string unused_options(const spill::ArenaOptions& o, const std::vector<std::string>& given) {
  auto applies = [&o](const std::string& key) {
    const bool disk = o.backing == spill::Backing::disk;
    if (key == "directory" || key == "allow_memory_backed_directory" ||
        key == "start_writeback_after_write" || key == "io") {
      return disk;
    }
    if (key == "page_cache_limit_bytes") return disk && o.io != spill::IoMode::direct;
    if (key == "staging_bytes") return disk && o.io != spill::IoMode::buffered;
    return true;
  };
  std::string unused;
  for (const std::string& key : given) {
    if (!applies(key)) unused += (unused.empty() ? "" : ", ") + key;
  }
  if (unused.empty()) return "";
  return "spillarena: SpillArena(backing=\"" + std::string(spill::to_string(o.backing)) +
         "\", io=\"" + spill::to_string(o.io) + "\") does not use " + unused +
         "; they are ignored (see spill::ArenaOptions)";
}

// Whether `name` is a field of `Struct` (through spill::detail::visit_fields).
template <class Struct>
bool has_field(const std::string& name) {
  Struct s;
  bool found = false;
  spill::detail::visit_fields(
      s, [&](const char* field, const auto&) { found = found || name == field; });
  return found;
}

// The keywords of SpillArena(...): the arena's options, then its stash's.
const std::vector<std::string>& keyword_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    const auto add = [&out](const char* name, const auto&) { out.emplace_back(name); };
    const spill::ArenaOptions arena;
    const spill::StashOptions stash;
    spill::detail::visit_fields(arena, add);
    spill::detail::visit_fields(stash, add);
    return out;
  }();
  return names;
}

// SpillArena(...) takes the arena's options (spill::ArenaOptions) and those of its stash
// (spill::StashOptions, kept with the arena by spill::set_stash_options) as one set of keywords.
spill::SpillArena make_arena(py::handle capacity_bytes, py::handle directory,
                             const py::kwargs& options) {
  spill::ArenaOptions parsed;
  spill::StashOptions stash;
  std::vector<std::string> given;
  set_field(parsed, "capacity_bytes", capacity_bytes);
  if (!directory.is_none()) {
    set_field(parsed, "directory", directory);
    given.push_back("directory");
    if (parsed.directory.empty()) {
      throw spill::InvalidArgumentError(
          "spillarena: directory='': " +
          spill::empty_directory_refusal("pass directory=None or leave it out"));
    }
  }
  for (const auto& [key, value] : options) {
    // capacity_bytes and directory given twice never get here: Python raises TypeError.
    given.push_back(current_option_name(key.cast<std::string>()));
    if (has_field<spill::StashOptions>(given.back())) {
      set_field(stash, given.back(), value);
    } else {
      set_field(parsed, given.back(), value, keyword_names());
    }
  }
  if (const std::string warning = unused_options(parsed, given); !warning.empty()) {
    if (PyErr_WarnEx(PyExc_UserWarning, warning.c_str(), 1) != 0) throw py::error_already_set();
  }
  // Vetting and preallocating the file takes a while; other Python threads may run meanwhile.
  py::gil_scoped_release no_gil;
  spill::SpillArena arena(parsed);
  spill::set_stash_options(arena, stash);
  return arena;
}

py::dict options_of(const spill::SpillArena& arena) {
  py::dict out = to_dict(arena.options());
  out.attr("update")(to_dict(spill::stash_options(arena)));
  return out;
}

py::str describe(const spill::SpillArena& arena) {
  const spill::ArenaStats s = arena.stats();
  // repr() of the decoded path: quotes and escapes as Python writes them, whatever its bytes.
  const std::string where =
      arena.backing() == spill::Backing::disk
          ? "directory=" + py::repr(path_to_python(arena.directory())).cast<std::string>() + " (" +
                arena.file_system_type() + ")"
          : std::string("backing='ram'");
  return message_to_python(
      "<spillarena.SpillArena capacity_bytes=" + std::to_string(s.capacity_bytes) + " " + where +
      " bytes_in_use=" + std::to_string(s.bytes_in_use) + ">");
}

std::uint64_t layer_inputs_bytes(py::handle layers, py::handle shape,
                                 py::handle element_size_bytes) {
  if (!py::isinstance<py::sequence>(shape) || py::isinstance<py::str>(shape) ||
      py::len(shape) != 3) {
    throw_bad_value("bytes_for_layer_inputs: shape", "a (batch, seq, hidden) tuple", shape);
  }
  const py::sequence dims = py::reinterpret_borrow<py::sequence>(shape);
  using U = Convert<std::uint64_t>;
  spill::ActivationShape parsed;
  parsed.batch = U::from_python(dims[0], "bytes_for_layer_inputs: batch");
  parsed.seq = U::from_python(dims[1], "bytes_for_layer_inputs: seq");
  parsed.hidden = U::from_python(dims[2], "bytes_for_layer_inputs: hidden");
  return spill::bytes_for_layer_inputs(
      U::from_python(layers, "bytes_for_layer_inputs: layers"), parsed,
      U::from_python(element_size_bytes, "bytes_for_layer_inputs: element size"));
}

py::dict memory_limits_dict() {
  const spill::MemoryLimits m = spill::memory_limits();
  py::dict out;
  out["cgroup_version"] = m.cgroup_version;
  out["cgroup_limit_bytes"] = m.cgroup_limit_bytes;
  out["cgroup_usage_bytes"] = m.cgroup_usage_bytes;
  out["cgroup_peak_bytes"] = m.cgroup_peak_bytes;
  out["cgroup_anon_bytes"] = m.cgroup_anon_bytes;
  out["mem_available_bytes"] = m.mem_available_bytes;
  out["mem_total_bytes"] = m.mem_total_bytes;
  out["usable_bytes"] = m.usable_bytes();
  out["pressure"] = m.pressure();
  return out;
}

}  // namespace

void bind_arena(py::module_& m) {
  py::class_<spill::SpillArena> arena(
      m, "SpillArena",
      "One preallocated spill file (or host-memory block) carved into regions for layer inputs. "
      "Options as in spill::ArenaOptions and spill::StashOptions. Copies share it; it cannot be "
      "pickled.");
  share_on_copy(arena, "SpillArena");
  arena.def(py::init(&make_arena), py::arg("capacity_bytes"), py::arg("directory") = py::none())
      .def(
          "stats", [](const spill::SpillArena& a) { return to_dict(a.stats()); },
          "A dict keyed by spill::ArenaStats field names.")
      .def(
          "stash_stats",
          [](const spill::SpillArena& a) {
            spill::StashStats stats;
            {
              py::gil_scoped_release release;  // the stash's mutex, as in _Chain.stats
              stats = spill::stash_stats(a);
            }
            return to_dict(stats);
          },
          "A dict keyed by spill::StashStats field names: what spillarena.checkpoint did with this "
          "arena's host budget (host pool, device bytes held, bytes in flight, waits).")
      .def("options", &options_of,
           "The options as resolved (directory, I/O mode, rounded sizes), keyed by the field "
           "names of spill::ArenaOptions, then spill::StashOptions.")
      .def_property_readonly("capacity_bytes",
                             [](const spill::SpillArena& a) { return a.stats().capacity_bytes; })
      .def_property_readonly("backing",
                             [](const spill::SpillArena& a) {
                               return Convert<spill::Backing>::to_python(a.backing());
                             })
      .def_property_readonly(
          "directory", [](const spill::SpillArena& a) { return path_to_python(a.directory()); })
      .def_property_readonly("file_system_type", &spill::SpillArena::file_system_type)
      .def_property_readonly("opened_without_name", &spill::SpillArena::opened_without_name)
      .def("__repr__", &describe);

  m.attr("ARENA_OPTIONS") = py::tuple(py::cast(keyword_names()));
  m.attr("STASH_OPTIONS") = py::tuple(to_dict(spill::StashOptions{}).attr("keys")());
  m.attr("ARENA_STATS") = py::tuple(to_dict(spill::ArenaStats{}).attr("keys")());
  m.attr("STASH_STATS") = py::tuple(to_dict(spill::StashStats{}).attr("keys")());
  m.attr("MAX_CAPACITY_BYTES") = py::int_(spill::kMaxCapacityBytes);
  m.attr("MAX_STAGING_BYTES") = py::int_(spill::kMaxStagingBytes);
  m.def("default_spill_directory", [] { return path_to_python(spill::default_spill_directory()); });
  m.def("_empty_directory_refusal", &spill::empty_directory_refusal, py::arg("instead"),
        "The one wording of the refusal of an empty directory string (spill/directory.h).");
  m.def("memory_limits", &memory_limits_dict,
        "This process's memory ceiling: its memory cgroup (v1 or v2), MemAvailable, MemTotal, "
        "what it may still take (usable_bytes) and how close it is (pressure, 0 to 1)");
  m.def("_bytes_for_layer_inputs", &layer_inputs_bytes, py::arg("layers"), py::arg("shape"),
        py::arg("element_size_bytes"));
  m.def("_bytes_with_units", &spill::bytes_with_units, py::arg("bytes"),
        "\"16384 bytes (16.00 KiB)\": byte counts as every message gives them (spill/units.h).");
}

}  // namespace spillarena_python
