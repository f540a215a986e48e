// C++ spill::Error and its subclasses become the Python classes of the same names in
// spillarena/errors.py, with the same message and the C++ fields as attributes.
#include <exception>
#include <initializer_list>
#include <utility>

#include "binding.h"

namespace spillarena_python {
namespace {

using Fields = std::initializer_list<std::pair<const char*, py::object>>;

// Note [Exception classes live in Python]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The hierarchy is declared in spillarena/errors.py, so a class can also derive from a builtin
// (InvalidArgumentError is a ValueError) and be documented and pickled as plain Python. The
// translator looks the class up by the C++ name and sets the C++ fields as attributes.
void raise(const char* name, const std::exception& e, Fields fields) {
  py::object cls = py::module_::import("spillarena.errors").attr(name);
  py::object error = cls(message_to_python(e.what()));
  for (const auto& [key, value] : fields) error.attr(key) = value;
  PyErr_SetObject(cls.ptr(), error.ptr());
}

py::object num(std::uint64_t v) { return py::int_(v); }
// Paths as os.fsdecode spells them (see Note [Paths are bytes, as the OS sees them]).
py::object text(const std::string& v) { return path_to_python(v); }

void translate(std::exception_ptr thrown) {
  try {
    std::rethrow_exception(thrown);
  } catch (const spill::InvalidArgumentError& e) {
    raise("InvalidArgumentError", e, {});
  } catch (const spill::PathError& e) {
    const char* type = dynamic_cast<const spill::DirectoryError*>(&e)       ? "DirectoryError"
                       : dynamic_cast<const spill::PreallocationError*>(&e) ? "PreallocationError"
                                                                             : "PathError";
    raise(type, e, {{"path", text(e.path())}, {"errno", py::int_(e.error_number())}});
  } catch (const spill::MemoryBackedDirectoryError& e) {
    raise("MemoryBackedDirectoryError", e,
          {{"path", text(e.path())}, {"file_system_type", text(e.file_system_type())}});
  } catch (const spill::InsufficientSpaceError& e) {
    raise("InsufficientSpaceError", e,
          {{"path", text(e.path())},
           {"needed_bytes", num(e.needed_bytes())},
           {"available_bytes", num(e.available_bytes())}});
  } catch (const spill::ArenaExhaustedError& e) {
    raise("ArenaExhaustedError", e,
          {{"requested_bytes", num(e.requested_bytes())},
           {"free_bytes", num(e.free_bytes())},
           {"largest_free_block", num(e.largest_free_block())}});
  } catch (const spill::MovedFromRegionError& e) {
    raise("MovedFromRegionError", e, {});
  } catch (const spill::IoError& e) {
    raise("IoError", e,
          {{"errno", py::int_(e.error_number())},
           {"op", text(spill::to_string(e.op()))},
           {"offset", num(e.offset())},
           {"bytes", num(e.bytes())}});
  } catch (const spill::IntegrityError& e) {
    raise("IntegrityError", e,
          {{"region_offset", num(e.region_offset())},
           {"offset_in_region", num(e.offset_in_region())},
           {"bytes", num(e.bytes())},
           {"expected_hash", num(e.expected_hash())},
           {"found_hash", num(e.found_hash())}});
  } catch (const spill::GdsUnavailableError& e) {
    raise("GdsUnavailableError", e,
          {{"library", text(e.library())}, {"cufile_status", py::int_(e.cufile_status())}});
  } catch (const spill::ForkedProcessError& e) {
    raise("ForkedProcessError", e,
          {{"creator_pid", num(e.creator_pid())}, {"current_pid", num(e.current_pid())}});
  } catch (const spill::CheckpointError& e) {
    raise("CheckpointError", e, {});
  } catch (const spill::Error& e) {
    raise("Error", e, {});
  }
}

}  // namespace

void bind_errors(py::module_& m) {
  py::register_exception_translator(&translate);
  // Lets the tests (and users checking their handlers) raise each C++ type through the
  // translator, without having to provoke every failure for real.
  m.def("_throw", [](const std::string& type, const std::string& message) {
    if (type == "InvalidArgumentError") throw spill::InvalidArgumentError(message);
    if (type == "PathError") throw spill::PathError("/spill", 13, message);
    if (type == "DirectoryError") throw spill::DirectoryError("/nowhere", 2, message);
    if (type == "MemoryBackedDirectoryError")
      throw spill::MemoryBackedDirectoryError("/dev/shm", "tmpfs", message);
    if (type == "InsufficientSpaceError")
      throw spill::InsufficientSpaceError("/spill", 2048, 1024, message);
    if (type == "PreallocationError") throw spill::PreallocationError("/spill", 95, message);
    if (type == "ArenaExhaustedError") throw spill::ArenaExhaustedError(4096, 1024, 512, message);
    if (type == "MovedFromRegionError") throw spill::MovedFromRegionError(message);
    if (type == "IoError") throw spill::IoError(5, message, spill::IoOp::read, 4096, 8192);
    if (type == "IntegrityError") throw spill::IntegrityError(4096, 0, 8192, 1, 2, message);
    if (type == "GdsUnavailableError")
      throw spill::GdsUnavailableError("libcufile.so.0", 5011, message);
    if (type == "ForkedProcessError") throw spill::ForkedProcessError(100, 101, message);
    if (type == "CheckpointError") throw spill::CheckpointError(message);
    throw spill::Error(message);
  });
}

}  // namespace spillarena_python
