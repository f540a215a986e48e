// The LibTorch-free core of spillarena: bytes and pointers only.
//
//   #include <spill/core.h>
//   spill::ArenaOptions options;
//   options.capacity_bytes = spill::bytes_for_layer_inputs(24, {4, 2048, 1024}, 2);
//   spill::SpillArena arena(options);
//   spill::Region r = arena.allocate(16 * spill::MiB);
//   r.write(buffer, 16 * spill::MiB);
//   r.read(buffer, 16 * spill::MiB);
#pragma once

#include "spill/arena.h"
#include "spill/directory.h"
#include "spill/error.h"
#include "spill/io.h"
#include "spill/process_memory.h"
#include "spill/sizing.h"
#include "spill/units.h"
