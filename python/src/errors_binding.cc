// C++ spill::Error and its subclasses become the Python classes of the same names in
// spillarena.errors, with the same message and the C++ fields as attributes.
#include <exception>
#include <functional>
#include <string>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

#include "binding.h"
#include "core/text/quote.h"
#include "fields.h"

namespace spillarena_python {
namespace {

using Fields = std::vector<std::pair<const char*, Ref>>;

// Note [One table of error classes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The error types are declared once in C++ (include/spill/error.h). Everything else about them
// comes from the table below, one row per type: its Python name, its Python docstring, the
// builtin it is also (InvalidArgumentError is a ValueError), the fields it carries and an
// example used by the tests. spillarena/errors.py makes its classes from this table at import
// (_C._error_classes), so the Python module lists no class of its own, and the translator below
// walks the same rows. A row's base is found from the C++ type (std::is_base_of checked at
// compile time), never written as a second name. A C++ class the table lacks would reach Python
// as its nearest base; tests/python/test_errors.py compares the table with error.h's classes.
//
// The classes are plain Python classes (picklable, catchable, documented by their docstrings);
// only a static type checker, which cannot run the import, sees them as untyped.
struct ErrorClass {
  const char* name;
  const char* builtin;  // a Python builtin the class also derives from, or ""
  const char* doc;
  std::type_index type;
  std::type_index base;  // the type itself for spill::Error
  std::function<bool(const std::exception&)> matches;
  std::function<Fields(const std::exception&)> fields;
  std::function<void(const std::string&)> example;  // throws the type with that message
};

// `fields(const T&)` gives the attributes (a function of a base's type will do).
template <class T, class Base, class FieldsOf>
ErrorClass row(const char* name, const char* builtin, const char* doc, FieldsOf fields,
               void (*example)(const std::string&)) {
  static_assert(std::is_base_of_v<Base, T>, "a row's base must be a base of its type");
  return {name,
          builtin,
          doc,
          typeid(T),
          typeid(Base),
          [](const std::exception& e) { return dynamic_cast<const T*>(&e) != nullptr; },
          [fields](const std::exception& e) { return fields(dynamic_cast<const T&>(e)); },
          example};
}

Ref num(std::uint64_t v) { return Convert<std::uint64_t>::to_python(v); }
Ref integer(int v) { return Convert<int>::to_python(v); }
// Paths as os.fsdecode spells them (see Note [Paths are bytes, as the OS sees them]).
Ref text(const std::string& v) { return path_to_python(v); }

Fields no_fields(const spill::Error&) { return {}; }
Fields path_fields(const spill::PathError& e) {
  return {{"path", text(e.path())}, {"errno", integer(e.error_number())}};
}

// Parents before children: errors.py makes the classes in this order.
const std::vector<ErrorClass>& error_classes() {
  static const std::vector<ErrorClass> rows{
      row<spill::Error, spill::Error>(
          "Error", "", "spill::Error: the base of every spillarena error.", no_fields,
          [](const std::string& m) { throw spill::Error(m); }),
      row<spill::InvalidArgumentError, spill::Error>(
          "InvalidArgumentError", "ValueError",
          "An option or argument out of range (capacity 0, a non-tensor layer input, ...).",
          no_fields, [](const std::string& m) { throw spill::InvalidArgumentError(m); }),
      row<spill::PathError, spill::Error>(
          "PathError", "",
          "A file system call on ``path`` failed with ``errno``: the base of DirectoryError and "
          "PreallocationError.",
          path_fields, [](const std::string& m) { throw spill::PathError("/spill", 13, m); }),
      row<spill::DirectoryError, spill::PathError>(
          "DirectoryError", "",
          "The spill directory is missing, not a directory or not writable (``path``, "
          "``errno``).",
          path_fields, [](const std::string& m) { throw spill::DirectoryError("/nowhere", 2, m); }),
      row<spill::PreallocationError, spill::PathError>(
          "PreallocationError", "",
          "The file system cannot preallocate, or the mapping failed (``path``, ``errno``).",
          path_fields,
          [](const std::string& m) { throw spill::PreallocationError("/spill", 95, m); }),
      row<spill::MemoryBackedDirectoryError, spill::Error>(
          "MemoryBackedDirectoryError", "",
          "The spill directory lives in RAM (tmpfs, ...) (``path``, ``file_system_type``).",
          [](const spill::MemoryBackedDirectoryError& e) -> Fields {
            return {{"path", text(e.path())}, {"file_system_type", text(e.file_system_type())}};
          },
          [](const std::string& m) {
            throw spill::MemoryBackedDirectoryError("/dev/shm", "tmpfs", m);
          }),
      row<spill::InsufficientSpaceError, spill::Error>(
          "InsufficientSpaceError", "",
          "Less room than the capacity asked (``path``, ``needed_bytes``, ``available_bytes``).",
          [](const spill::InsufficientSpaceError& e) -> Fields {
            return {{"path", text(e.path())},
                    {"needed_bytes", num(e.needed_bytes())},
                    {"available_bytes", num(e.available_bytes())}};
          },
          [](const std::string& m) {
            throw spill::InsufficientSpaceError("/spill", 2048, 1024, m);
          }),
      row<spill::ArenaExhaustedError, spill::Error>(
          "ArenaExhaustedError", "",
          "No free block is large enough (``requested_bytes``, ``free_bytes``, "
          "``largest_free_block``). The arena is unchanged and stays usable.",
          [](const spill::ArenaExhaustedError& e) -> Fields {
            return {{"requested_bytes", num(e.requested_bytes())},
                    {"free_bytes", num(e.free_bytes())},
                    {"largest_free_block", num(e.largest_free_block())}};
          },
          [](const std::string& m) { throw spill::ArenaExhaustedError(4096, 1024, 512, m); }),
      row<spill::MovedFromRegionError, spill::Error>(
          "MovedFromRegionError", "", "A region handle was used after it was moved from or freed.",
          no_fields, [](const std::string& m) { throw spill::MovedFromRegionError(m); }),
      row<spill::IoError, spill::Error>(
          "IoError", "",
          "A read or write of region data failed (``errno``, ``op``, ``offset``, ``bytes``).",
          [](const spill::IoError& e) -> Fields {
            return {{"errno", integer(e.error_number())},
                    {"op", text(spill::to_string(e.op()))},
                    {"offset", num(e.offset())},
                    {"bytes", num(e.bytes())}};
          },
          [](const std::string& m) { throw spill::IoError(5, m, spill::IoOp::read, 4096, 8192); }),
      row<spill::IntegrityError, spill::Error>(
          "IntegrityError", "",
          "Bytes read back from a region are not those written there: the spill file or the disk "
          "changed behind the arena's back (``region_offset``, ``offset_in_region``, ``bytes``, "
          "``expected_hash``, ``found_hash``). Raised before the bytes are used.",
          [](const spill::IntegrityError& e) -> Fields {
            return {{"region_offset", num(e.region_offset())},
                    {"offset_in_region", num(e.offset_in_region())},
                    {"bytes", num(e.bytes())},
                    {"expected_hash", num(e.expected_hash())},
                    {"found_hash", num(e.found_hash())}};
          },
          [](const std::string& m) { throw spill::IntegrityError(4096, 0, 8192, 1, 2, m); }),
      row<spill::GdsUnavailableError, spill::Error>(
          "GdsUnavailableError", "",
          "io=\"gds\" was asked but GPUDirect Storage cannot run here: libcufile could not be "
          "loaded (``cufile_status`` 0) or cuFile refused to start (its CU_FILE_... code); "
          "``library`` is the library searched.",
          [](const spill::GdsUnavailableError& e) -> Fields {
            return {{"library", text(e.library())}, {"cufile_status", integer(e.cufile_status())}};
          },
          [](const std::string& m) {
            throw spill::GdsUnavailableError("libcufile.so.0", 5011, m);
          }),
      row<spill::ForkedProcessError, spill::Error>(
          "ForkedProcessError", "",
          "An arena (or a stash or region of it) was used in a child of fork(): an arena belongs "
          "to the process that made it (``creator_pid``, ``current_pid``). Make a new arena in "
          "the child.",
          [](const spill::ForkedProcessError& e) -> Fields {
            return {{"creator_pid", num(e.creator_pid())}, {"current_pid", num(e.current_pid())}};
          },
          [](const std::string& m) { throw spill::ForkedProcessError(100, 101, m); }),
      row<spill::CheckpointError, spill::Error>(
          "CheckpointError", "",
          "Misuse of the checkpoint wrapper, e.g. a second backward through the same graph.",
          no_fields, [](const std::string& m) { throw spill::CheckpointError(m); }),
  };
  return rows;
}

const ErrorClass* find(std::type_index type) {
  for (const ErrorClass& c : error_classes()) {
    if (c.type == type) return &c;
  }
  return nullptr;
}

Ref errors_module() { return Ref::steal(PyImport_ImportModule("spillarena.errors")); }

PyObject* error_classes_list(PyObject*, PyObject*) {
  return guarded([] {
    Ref out = Ref::steal(PyList_New(0));
    for (const ErrorClass& c : error_classes()) {
      const ErrorClass* base = c.base == c.type ? nullptr : find(c.base);
      if (c.base != c.type && base == nullptr) {
        throw spill::Error(std::string("spillarena: the base of ") + c.name + " has no row");
      }
      const Ref base_name = base ? message_to_python(base->name) : Ref::borrow(Py_None);
      const Ref row = Ref::steal(PyTuple_Pack(4, message_to_python(c.name).get(), base_name.get(),
                                              message_to_python(c.builtin).get(),
                                              message_to_python(c.doc).get()));
      if (PyList_Append(out.get(), row.get()) != 0) throw PythonError();
    }
    return out;
  });
}

// Lets the tests (and users checking their handlers) raise each C++ type through the
// translation, without having to provoke every failure for real.
PyObject* throw_example(PyObject*, PyObject* args) {
  return guarded([&]() -> Ref {
    const Args a(args, 2, "_throw");
    const std::string type = utf8(a[0], "_throw: type");
    const std::string message = utf8(a[1], "_throw: message");
    for (const ErrorClass& c : error_classes()) {
      if (type == c.name) c.example(message);
    }
    throw spill::InvalidArgumentError("spillarena: no error class " + spill::detail::quote(type));
  });
}

}  // namespace

// The most derived row that matches: children come after their parents in the table. A failure
// to make the Python error (no memory) leaves that error set instead.
void raise_in_python(const spill::Error& e) {
  try {
    const auto& rows = error_classes();
    for (auto c = rows.rbegin(); c != rows.rend(); ++c) {
      if (!c->matches(e)) continue;
      const Ref cls = errors_module().attr(c->name);
      const Ref error = cls(message_to_python(e.what()).get());
      for (const auto& [key, value] : c->fields(e)) {
        if (PyObject_SetAttrString(error.get(), key, value.get()) != 0) throw PythonError();
      }
      PyErr_SetObject(cls.get(), error.get());
      return;
    }
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (const PythonError& failed) {
    failed.restore();
  }
}

void add_errors() {
  // (name, base name or None, builtin name or "", docstring), parents first.
  add_function("_error_classes", error_classes_list, METH_NOARGS,
               "The error classes: (name, base or None, builtin or '', docstring), parents first.");
  add_function("_throw", throw_example, METH_VARARGS,
               "_throw(type, message) raises the C++ error type `type` through the translation.");
}

}  // namespace spillarena_python
