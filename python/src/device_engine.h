// The Python front end's CopyEngine: the stash's device copies and device memory made by torch
// through Python (python/spillarena/device_copies.py), since this extension links no torch.
// See Note [Device copies through Python] in python/src/device_engine.cc.
//
//   std::shared_ptr<spill::detail::CopyEngine> engine = python_engine_for_inputs();
#pragma once

#include <memory>

#include "core/stash/copy_engine.h"

namespace spillarena_python {

// The override while a test installed one, else the engine of device_copies.py.
std::shared_ptr<spill::detail::CopyEngine> python_engine_for_inputs();

// At import: from interpreter exit on, the stash's threads no longer enter Python (Note [No
// Python once the interpreter ends] in python/src/device_engine.cc).
void close_python_at_exit();

}  // namespace spillarena_python
