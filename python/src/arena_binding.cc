// spillarena.SpillArena, its options and stats, and the sizing helpers.
#include <utility>

#include <pybind11/stl.h>

#include "binding.h"
#include "spill/arena.h"
#include "spill/io.h"
#include "spill/sizing.h"

namespace spillarena_python {

template <>
struct EnumNames<spill::Backing> {
  static constexpr std::pair<const char*, spill::Backing> values[] = {
      {"disk", spill::Backing::disk},
      {"ram", spill::Backing::ram},
  };
};

template <>
struct EnumNames<spill::IoMode> {
  static constexpr std::pair<const char*, spill::IoMode> values[] = {
      {"buffered", spill::IoMode::buffered},
      {"direct", spill::IoMode::direct},
      {"automatic", spill::IoMode::automatic},
  };
};

template <>
struct EnumNames<spill::IoBackend> {
  static constexpr std::pair<const char*, spill::IoBackend> values[] = {
      {"automatic", spill::IoBackend::automatic},
      {"io_uring", spill::IoBackend::io_uring},
      {"thread_pool", spill::IoBackend::thread_pool},
  };
};

namespace {

// The keyword options of SpillArena(...): one line per spill::ArenaOptions field.
const FieldTable<spill::ArenaOptions>& options_table() {
  using O = spill::ArenaOptions;
  static const auto table = FieldTable<O>()
                                .field("directory", &O::directory)
                                .field("capacity_bytes", &O::capacity_bytes)
                                .field("backing", &O::backing)
                                .field("allow_ram_backed_directory", &O::allow_ram_backed_directory)
                                .field("start_writeback_after_write", &O::start_writeback_after_write)
                                .field("page_cache_limit_bytes", &O::page_cache_limit_bytes)
                                .field("io", &O::io)
                                .field("io_backend", &O::io_backend)
                                .field("staging_bytes", &O::staging_bytes)
                                .field("asynchronous", &O::asynchronous)
                                .field("prefetch_depth", &O::prefetch_depth)
                                .field("keep_last", &O::keep_last)
                                .field("verify_integrity", &O::verify_integrity);
  return table;
}

// The keys of SpillArena.stats(): one line per spill::ArenaStats field.
const FieldTable<spill::ArenaStats>& stats_table() {
  using S = spill::ArenaStats;
  static const auto table = FieldTable<S>()
                                .field("capacity_bytes", &S::capacity_bytes)
                                .field("bytes_in_use", &S::bytes_in_use)
                                .field("peak_bytes_in_use", &S::peak_bytes_in_use)
                                .field("bytes_requested", &S::bytes_requested)
                                .field("live_regions", &S::live_regions)
                                .field("allocations", &S::allocations)
                                .field("frees", &S::frees)
                                .field("reuse_hits", &S::reuse_hits)
                                .field("largest_free_block", &S::largest_free_block)
                                .field("free_bytes", &S::free_bytes)
                                .field("high_water_bytes", &S::high_water_bytes)
                                .field("bytes_written", &S::bytes_written)
                                .field("bytes_read", &S::bytes_read)
                                .field("io_mode", &S::io_mode)
                                .field("io_backend", &S::io_backend)
                                .field("io_note", &S::io_note)
                                .field("staging_bytes", &S::staging_bytes)
                                .field("staging_waits", &S::staging_waits)
                                .field("staging_wait_ns", &S::staging_wait_ns)
                                .field("restores", &S::restores)
                                .field("restore_waits", &S::restore_waits)
                                .field("restore_wait_ns", &S::restore_wait_ns)
                                .field("prefetches", &S::prefetches)
                                .field("prefetch_hits", &S::prefetch_hits)
                                .field("bytes_hashed", &S::bytes_hashed)
                                .field("bytes_verified", &S::bytes_verified)
                                .field("integrity_failures", &S::integrity_failures);
  return table;
}

spill::SpillArena make_arena(py::handle capacity_bytes, py::handle directory,
                             const py::kwargs& options) {
  spill::ArenaOptions parsed;
  const auto& table = options_table();
  table.set(parsed, "capacity_bytes", capacity_bytes);
  if (!directory.is_none()) table.set(parsed, "directory", directory);
  for (const auto& [key, value] : options) {
    // capacity_bytes and directory given twice never get here: Python raises TypeError.
    table.set(parsed, key.cast<std::string>(), value);
  }
  // Vetting and preallocating the file takes a while; other Python threads may run meanwhile.
  py::gil_scoped_release no_gil;
  return spill::SpillArena(parsed);
}

std::string describe(const spill::SpillArena& arena) {
  const spill::ArenaStats s = arena.stats();
  std::string where = arena.backing() == spill::Backing::disk
                          ? "directory='" + arena.directory() + "' (" + arena.file_system_type() + ")"
                          : std::string("backing='ram'");
  return "<spillarena.SpillArena capacity_bytes=" + std::to_string(s.capacity_bytes) + " " +
         where + " bytes_in_use=" + std::to_string(s.bytes_in_use) + ">";
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
  return spill::bytes_for_layer_inputs(U::from_python(layers, "bytes_for_layer_inputs: layers"),
                                       parsed,
                                       U::from_python(element_size_bytes,
                                                      "bytes_for_layer_inputs: element size"));
}

}  // namespace

void bind_arena(py::module_& m) {
  py::class_<spill::SpillArena>(m, "SpillArena",
                                "One preallocated spill file (or host-memory block) carved into "
                                "regions for layer inputs. Options as in spill::ArenaOptions.")
      .def(py::init(&make_arena), py::arg("capacity_bytes"), py::arg("directory") = py::none())
      .def(
          "stats", [](const spill::SpillArena& a) { return stats_table().to_dict(a.stats()); },
          "A dict keyed by spill::ArenaStats field names.")
      .def(
          "options",
          [](const spill::SpillArena& a) { return options_table().to_dict(a.options()); },
          "The options as resolved (directory, I/O mode, rounded sizes), keyed by field name.")
      .def_property_readonly("capacity_bytes",
                             [](const spill::SpillArena& a) { return a.stats().capacity_bytes; })
      .def_property_readonly("backing",
                             [](const spill::SpillArena& a) {
                               return Convert<spill::Backing>::to_python(a.backing());
                             })
      .def_property_readonly("directory", &spill::SpillArena::directory)
      .def_property_readonly("file_system_type", &spill::SpillArena::file_system_type)
      .def_property_readonly("unnamed_by_o_tmpfile", &spill::SpillArena::unnamed_by_o_tmpfile)
      .def("__repr__", &describe);

  m.attr("ARENA_OPTIONS") = py::tuple(py::cast(options_table().names()));
  m.attr("ARENA_STATS") = py::tuple(py::cast(stats_table().names()));
  m.attr("MAX_CAPACITY_BYTES") = py::int_(spill::kMaxCapacityBytes);
  m.attr("MAX_STAGING_BYTES") = py::int_(spill::kMaxStagingBytes);
  m.def("default_spill_directory", &spill::default_spill_directory);
  m.def("_bytes_for_layer_inputs", &layer_inputs_bytes, py::arg("layers"), py::arg("shape"),
        py::arg("element_size_bytes"));
}

}  // namespace spillarena_python
