// spillarena: size a spill arena for a model (plan) and train a real model through one (train).
//
//   spillarena plan --layers 32 --batch 1 --seq 8192 --hidden 4096 --dtype bf16 --dir /mnt/nvme
//   spillarena train                       # small GPT on an embedded text, blocks spilled to disk
//   spillarena train --mode recompute --steps 50 --json
//
// Exit codes: 0 success, 1 runtime problem (directory, disk space, capacity), 2 usage error.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <iostream>

#include "plan_command.h"
#include "spill/error.h"
#include "train_command.h"

namespace {

using spill::cli::PlanRequest;
using spill::cli::TrainRequest;

// Whole numbers >= 1, with a message that names the value.
const CLI::Validator kPositive(
    [](std::string& value) -> std::string {
      const bool digits = !value.empty() && value.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::stoull(value) == 0) {
        return "must be a whole number of at least 1, got '" + value + "'";
      }
      return "";
    },
    "POSITIVE");

void add_plan(CLI::App& app, PlanRequest& r) {
  auto* plan = app.add_subcommand("plan", "Size an arena for a model and check a spill directory");
  plan->add_option("--layers", r.layers, "Checkpointed layers")->required()->check(kPositive);
  plan->add_option("--batch", r.batch, "Batch size")->required()->check(kPositive);
  plan->add_option("--seq", r.seq, "Sequence length")->required()->check(kPositive);
  plan->add_option("--hidden", r.hidden, "Hidden size")->required()->check(kPositive);
  plan->add_option("--dtype", r.dtype, "Activation dtype: fp32, fp16, bf16, fp64")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            return spill::cli::element_size_of(v) ? "" : "unknown dtype '" + v +
                                                          "'; use fp32, fp16, bf16 or fp64";
          },
          "DTYPE"));
  plan->add_option("--dir", r.directory, "Spill directory (default: $SPILL_DIR, else temp dir)");
  plan->add_option("--layer-ms", r.layer_ms, "Forward time of one layer on your hardware (ms)")
      ->check(CLI::PositiveNumber);
  plan->add_option("--probe-bytes", r.probe_bytes, "Bytes for the bandwidth probe (0: skip)")
      ->capture_default_str()
      ->transform(CLI::AsSizeValue(false));
  plan->add_flag("--json", r.json, "Print one JSON object");
}

void add_train(CLI::App& app, TrainRequest& r) {
  auto* train = app.add_subcommand("train", "Train a small GPT-style model through a SpillArena");
  train->add_option("--mode", r.mode, "disk, ram, recompute, none or per-file")
      ->capture_default_str()
      ->check(CLI::IsMember({"disk", "ram", "recompute", "none", "per-file", "per_file"}));
  train->add_option("--layers", r.layers, "Transformer blocks")->capture_default_str()->check(kPositive);
  train->add_option("--hidden", r.hidden, "Hidden size")->capture_default_str()->check(kPositive);
  train->add_option("--heads", r.heads, "Attention heads")->capture_default_str()->check(kPositive);
  train->add_option("--seq", r.seq, "Sequence length")->capture_default_str()->check(kPositive);
  train->add_option("--batch", r.batch, "Batch size")->capture_default_str()->check(kPositive);
  train->add_option("--steps", r.steps, "Training steps")->capture_default_str()->check(kPositive);
  train->add_option("--lr", r.lr, "AdamW learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  train->add_option("--seed", r.seed, "Random seed (same seed, same losses in every mode)")
      ->capture_default_str();
  train->add_option("--dir", r.directory, "Spill directory (default: $SPILL_DIR, else temp dir)");
  train->add_option("--capacity", r.capacity, "Arena bytes, e.g. 512MiB (default: from the model)")
      ->transform(CLI::AsSizeValue(false));
  train->add_option("--dropout", r.dropout, "Dropout probability")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  train->add_option("--corpus", r.corpus, "Train on this text file instead of the embedded one");
  train->add_option("--sample-chars", r.sample_chars, "Characters to generate at the end")
      ->capture_default_str()
      ->check(kPositive);
  train->add_flag("--json", r.json, "Print the summary as one JSON object");
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"spillarena: gradient checkpointing that spills layer inputs to one file on disk"};
  app.require_subcommand(1);
  PlanRequest plan;
  TrainRequest train;
  add_plan(app, plan);
  add_train(app, train);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "spillarena: " << e.what() << " (see spillarena --help)\n";
    return 2;
  }
  try {
    if (app.got_subcommand("plan")) return spill::cli::run_plan(plan, std::cout);
    if (const std::string problem = spill::cli::check_train_request(train); !problem.empty()) {
      std::cerr << "spillarena: " << problem << "\n";
      return 2;
    }
    spill::cli::run_train(train, std::cout);
    return 0;
  } catch (const spill::Error& e) {
    std::cerr << "spillarena: " << e.what() << "\n";
  } catch (const c10::Error& e) {
    std::cerr << "spillarena: " << first_line(e.what_without_backtrace()) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "spillarena: " << e.what() << "\n";
  }
  return 1;
}
