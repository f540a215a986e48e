// Between torch's tensors, as DLPack capsules (torch.utils.dlpack), and the stash's Buffers: the
// Python front end's half of Note [The stash moves bytes] in src/core/stash/buffer.cc.
//
//   Buffer b = buffer_of(capsule);   // consumes the capsule; b keeps the tensor alive
//   Ref c = capsule_of(b);           // torch.utils.dlpack.from_dlpack(c): uint8, b.bytes() long
#pragma once

#include "core/stash/buffer.h"
#include "py.h"

namespace spillarena_python {

// The bytes of a 1-D uint8 contiguous tensor's capsule (Python passes t.reshape(-1).view(uint8)),
// owned from now on: the tensor is released, without the GIL, when the last Buffer of it dies.
// InvalidArgumentError for a capsule that is not one, or was consumed already.
spill::detail::Buffer buffer_of(PyObject* capsule);

// A capsule over `b`'s bytes (1-D uint8 on b's device) that keeps `b`'s owner alive until the
// tensor made from it dies, or the capsule does unused.
Ref capsule_of(const spill::detail::Buffer& b);

}  // namespace spillarena_python
