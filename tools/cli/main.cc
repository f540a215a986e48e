// spillarena: size a spill arena for a model (plan) and train a real model through one (train).
//
//   spillarena plan --layers 32 --batch 1 --seq 8192 --hidden 4096 --dtype bf16 --dir /mnt/nvme
//   spillarena train                       # small GPT on an embedded text, blocks spilled to disk
//   spillarena train --mode recompute --steps 50 --json
//
// Exit codes: 0 success, 1 runtime problem (directory, disk space, a diverging run, a failed write
// of the output, a plan that says no), 2 usage error (anything wrong with the command line alone,
// a --capacity too small for the model with --when-full error included; with the default
// keep_in_memory the arena grows). Every failure is one line on stderr; an option that does
// nothing in the chosen mode is one warning line there (see Note [Options a mode does not use] in
// tools/cli/train_command.cc).
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <csignal>
#include <iostream>

#include "core/text/quote.h"
#include "failures.h"
#include "modes.h"
#include "open_files.h"
#include "options.h"
#include "plan_command.h"
#include "spill/arena.h"
#include "spill/directory.h"
#include "spill/error.h"
#include "train_command.h"

namespace {

using spill::cli::add_count;
using spill::cli::add_real;
using spill::cli::add_size;
using spill::cli::PlanRequest;
using spill::cli::TrainRequest;

// Note [Bounds of the numeric options]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every number has an upper bound, so no product of them overflows before the arena's own
// checks run and no typo (a stray digit, a unit mistake) turns into a 16 EiB request. The plan
// bounds are wide (it only does arithmetic); the train bounds are what one CPU process can run.
constexpr std::uint64_t kMaxProbeBytes = 16ull << 30;
constexpr std::uint64_t kMaxSteps = 1'000'000'000;
// --lr: see Note [The learning rate AdamW can hold] in tools/cli/train_command.h.
using spill::cli::kMaxLearningRate;
using spill::cli::kMinLearningRate;

// What spill::default_spill_directory() picks.
constexpr const char* kDirHelp =
    "Spill directory (default: $SPILL_DIR, else $TMPDIR or /tmp; /var/tmp when those are in RAM)";

// --dir "" (an unset shell variable, `--dir "$SPILL"`) would silently mean the default directory.
CLI::Option* add_dir(CLI::App& command, std::string& directory) {
  return command.add_option("--dir", directory, kDirHelp)
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (!v.empty()) return "";
            return spill::empty_directory_refusal("omit --dir");
          },
          "DIR"));
}

void add_plan(CLI::App& app, PlanRequest& r) {
  auto* plan = app.add_subcommand("plan", "Size an arena for a model and check a spill directory");
  add_count(*plan, "--layers", r.layers, {1, 1ull << 20}, "Checkpointed layers")->required();
  add_count(*plan, "--batch", r.batch, {1, 1ull << 24}, "Batch size")->required();
  add_count(*plan, "--seq", r.seq, {1, 1ull << 24}, "Sequence length")->required();
  add_count(*plan, "--hidden", r.hidden, {1, 1ull << 20}, "Hidden size")->required();
  plan->add_option("--dtype", r.dtype,
                   "Activation dtype: fp32, fp16, bf16, fp64, fp8, int8 (or float32, half, ...)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (spill::cli::element_size_of(v) != 0) return "";
            return "unknown dtype " + spill::detail::quote(v) +
                   "; use fp32, fp16, bf16, fp64, fp8 or int8";
          },
          "DTYPE"));
  add_dir(*plan, r.directory);
  add_real(*plan, "--layer-ms", r.layer_ms, {0.0, 1e7, true, true},
           "Forward time of one layer on your hardware (ms; 0: not given); needs the bandwidth "
           "probe");
  add_size(*plan, "--probe-bytes", r.probe_bytes, {0, kMaxProbeBytes},
           "Bytes for the bandwidth probe, e.g. 64MiB (0: skip)");
  plan->add_flag("--json", r.json, "Print one JSON object");
}

void add_train_model(CLI::App& train, TrainRequest& r) {
  add_count(train, "--layers", r.layers, {1, 4096}, "Transformer blocks");
  add_count(train, "--hidden", r.hidden, {1, 65536}, "Hidden size");
  add_count(train, "--heads", r.heads, {1, 4096}, "Attention heads");
  add_count(train, "--seq", r.seq, {1, 1ull << 20}, "Sequence length");
  add_count(train, "--batch", r.batch, {1, 1ull << 20}, "Batch size");
  add_real(train, "--dropout", r.dropout, {0.0, 1.0, true, false},
           "Dropout probability (embeddings, residual branches)");
  add_real(train, "--attention-dropout", r.attention_dropout, {0.0, 1.0, true, false},
           "Dropout on attention weights; above 0, CPU attention materialises seq x seq scores");
}

// The arena's options (disk and ram modes; --dir also per-file). See Note [Growing the arena] in
// src/core/arena/arena_growth.cc for what --when-full, --no-grow and --growth-margin change.
void add_train_arena(CLI::App& train, TrainRequest& r) {
  add_dir(train, r.directory);
  add_size(train, "--capacity", r.capacity, {0, spill::kMaxCapacityBytes},
           "Arena bytes, e.g. 512MiB (0: from the model); a step that needs more grows it");
  train
      .add_option("--when-full", r.when_full,
                  "A layer input that finds no room in the arena: keep_in_memory (for that step, "
                  "as in-RAM checkpointing holds it) or error (the run stops instead: a --capacity "
                  "below what a step stashes is a usage error, exit 2, before the run starts)")
      ->capture_default_str()
      ->check(CLI::IsMember({"keep_in_memory", "keep-in-memory", "error"}));
  train.add_flag("--grow,!--no-grow", r.grow,
                 "Grow the spill file before the next step when a step needed more than its "
                 "capacity (default; --no-grow: never)");
  add_real(train, "--growth-margin", r.growth_margin,
           {spill::kMinGrowthMargin, spill::kMaxGrowthMargin},
           "A grown arena holds what the step needed times this (1 to 16)");
}

void add_train(CLI::App& app, TrainRequest& r) {
  auto* train = app.add_subcommand(
      "train",
      "Train a small GPT-style model through a SpillArena. An option the chosen --mode "
      "does not use (--io: disk only; --capacity, --when-full, --grow, --growth-margin: disk, "
      "ram; --dir: disk, per-file) is ignored with a one-line warning on stderr");
  train->add_option("--mode", r.mode, "disk, ram, recompute, none or per-file")
      ->capture_default_str()
      ->check(CLI::IsMember(spill::harness::mode_spellings()));
  train
      ->add_option("--io", r.io,
                   "Disk mode I/O: auto, also spelled automatic as in Python "
                   "and C++ (direct when the arena exceeds usable memory), buffered or direct")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "automatic", "buffered", "direct"}));
  add_train_model(*train, r);
  add_count(*train, "--steps", r.steps, {1, kMaxSteps}, "Training steps");
  add_real(*train, "--lr", r.lr, {kMinLearningRate, kMaxLearningRate},
           "AdamW learning rate, up to 3.4e37 (AdamW's float32 first step divides it by 0.1); a "
           "run whose loss stops being finite ends with exit 1");
  add_count(*train, "--seed", r.seed, {0, UINT64_MAX},
            "Random seed (same seed, same losses in every mode)");
  add_train_arena(*train, r);
  train->add_option("--corpus", r.corpus, "Train on this text file instead of the embedded one");
  add_count(*train, "--sample-chars", r.sample_chars, {0, 100000},
            "Characters to generate at the end (0: none)");
  add_count(*train, "--compare-steps", r.compare_steps, {0, 1000},
            "Steps of the same model with in-RAM checkpointing (recompute), alternated with as "
            "many of this mode after training, for the summary's step-time ratio (0: none)");
  train->add_flag("--keep-freed-memory", r.keep_freed_memory,
                  "Leave glibc's malloc thresholds alone (freed memory may stay in the process)");
  train->add_flag("--json", r.json, "Print the summary as one JSON object");
}

// Whether `option` of `command` was on the command line (not a default).
std::function<bool(const std::string&)> given_in(const CLI::App& app, const char* command) {
  const CLI::App* sub = app.get_subcommand(command);
  return [sub](const std::string& option) { return sub->count(option) > 0; };
}

int run_command(const CLI::App& app, const PlanRequest& plan, const TrainRequest& train) {
  if (const std::string problem = spill::cli::ensure_open_file_limit(); !problem.empty()) {
    return spill::cli::report_failure(problem);
  }
  if (app.got_subcommand("plan")) {
    if (const std::string problem = spill::cli::check_plan_request(plan); !problem.empty()) {
      return spill::cli::report_usage_error(problem);
    }
    return spill::cli::run_plan(plan, std::cout);
  }
  if (const std::string problem = spill::cli::check_train_request(train); !problem.empty()) {
    return spill::cli::report_usage_error(problem);
  }
  spill::cli::warn(spill::cli::unused_options(train, given_in(app, "train")));
  return spill::cli::run_train(train, std::cout);
}

}  // namespace

int main(int argc, char** argv) {
  // Note [Ignoring SIGXFSZ]
  // ~~~~~~~~~~~~~~~~~~~~~~~
  // Over a file size limit (ulimit -f) the kernel would kill the process; with the signal ignored,
  // fallocate and write fail with EFBIG, which becomes a typed error
  // (see Note [EFBIG is a size limit, not a disk] in src/core/file/io_advice.h).
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"spillarena: gradient checkpointing that spills layer inputs to one file on disk"};
  app.require_subcommand(1);
  PlanRequest plan;
  TrainRequest train;
  add_plan(app, plan);
  add_train(app, train);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return spill::cli::finish_output(app.exit(e));  // --help
    return spill::cli::report_usage_error(spill::detail::printable(e.what()) +
                                          " (see spillarena --help)");
  }
  return spill::cli::finish_output(
      spill::cli::run_guarded([&] { return run_command(app, plan, train); }));
}
