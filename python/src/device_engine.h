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

}  // namespace spillarena_python
