// The per-file baseline's files for Python (src/core/stash/per_file.h): spillarena.per_file_stash
// serializes with torch.save and hands the bytes here, so both front ends share the disk half.
#include <memory>
#include <string>
#include <utility>

#include "binding.h"
#include "core/stash/per_file.h"

namespace spillarena_python {

using spill::detail::PerFile;
using spill::detail::PerFileFiles;

template <>
struct CapsuleName<PerFileFiles> {
  static constexpr const char* value = "spillarena._PerFileFiles";
};
template <>
struct CapsuleName<std::unique_ptr<PerFile>> {
  static constexpr const char* value = "spillarena._PerFile";
};

namespace {

// _per_file_files(directory): the baseline's directory.
PyObject* make_files(PyObject*, PyObject* directory) {
  return guarded([&] {
    return hold(PerFileFiles(
        Convert<std::string>::from_python(directory, "make_per_file_stash: directory")));
  });
}

// _per_file_store(files, data: bytes): a file holding them.
PyObject* store(PyObject*, PyObject* args) {
  return guarded([&] {
    const Args a(args, 2, "_per_file_store");
    const PerFileFiles& files = held<PerFileFiles>(a[0]);
    char* data = nullptr;
    Py_ssize_t size = 0;
    if (PyBytes_AsStringAndSize(a[1], &data, &size) != 0) throw PythonError();
    std::unique_ptr<PerFile> file;
    {
      Unlocked unlocked;  // `data` stays valid: the caller holds the bytes object
      file = std::make_unique<PerFile>(files.store(
          [&](const spill::detail::Sink& sink) { sink(data, static_cast<std::size_t>(size)); }));
    }
    return hold(std::move(file));
  });
}

// _per_file_restore(file): the file's bytes; the file is removed.
PyObject* restore(PyObject*, PyObject* handle) {
  return guarded([&] {
    PerFile& file = *held<std::unique_ptr<PerFile>>(handle);
    std::string bytes;
    {
      Unlocked unlocked;
      file.restore([&](const spill::detail::Reader& read, std::uint64_t size_bytes) {
        bytes.resize(static_cast<std::size_t>(size_bytes));
        std::size_t at = 0;
        while (at < bytes.size()) {
          const std::size_t n = read(at, bytes.data() + at, bytes.size() - at);
          if (n == 0) break;
          at += n;
        }
      });
    }
    return Ref::steal(
        PyBytes_FromStringAndSize(bytes.data(), static_cast<Py_ssize_t>(bytes.size())));
  });
}

}  // namespace

void add_per_file() {
  add_function("_per_file_files", make_files, METH_O,
               "_per_file_files(directory): the per-file baseline's directory.");
  add_function("_per_file_store", store, METH_VARARGS,
               "_per_file_store(files, data): a new file holding `data` (bytes).");
  add_function("_per_file_restore", restore, METH_O, "The file's bytes; the file is removed.");
}

}  // namespace spillarena_python
