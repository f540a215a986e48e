// The spillarena command as a user runs it: exit codes, messages, identical losses per mode.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "test_support.h"

using spill_test::list_dir;
using spill_test::ScratchDir;

namespace {

struct Run {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs the command; `merge_stderr` folds error messages into the output.
Run capture(const std::string& args, bool merge_stderr) {
  const std::string cmd = std::string(SPILLARENA_CLI) + " " + args + (merge_stderr ? " 2>&1" : "");
  Run r;
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  std::size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Run run(const std::string& args) { return capture(args, true); }

Run run_json(const std::string& args, nlohmann::json* out) {
  Run r = capture(args, false);
  *out = nlohmann::json::parse(r.output);
  return r;
}

const char* kTiny = "--layers 2 --hidden 32 --heads 2 --seq 32 --batch 4 --sample-chars 8";

}  // namespace

// A usage error: exit code 2 and a message that names `mentions`.
void check_usage_error(const std::string& args, const std::string& mentions) {
  CAPTURE(args);
  Run r = run(args);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find(mentions) != std::string::npos);
}

TEST_CASE("cli: an unknown flag is a usage error with exit code 2") {
  check_usage_error("train --bogus-flag 3", "--bogus-flag");
}

TEST_CASE("cli: zero or negative sizes are usage errors naming the value") {
  check_usage_error("train --layers 0", "'0'");
  check_usage_error("train --layers 0", "--layers");
  check_usage_error("plan --layers 4 --batch -1 --seq 8 --hidden 8", "--batch");
}

TEST_CASE("cli: an unknown mode or dtype is a usage error") {
  check_usage_error("train --mode tape", "tape");
  check_usage_error("plan --layers 1 --batch 1 --seq 1 --hidden 1 --dtype fp13", "fp13");
}

TEST_CASE("cli: heads that do not divide the hidden size is a usage error") {
  check_usage_error("train --hidden 30 --heads 4", "--heads");
}

TEST_CASE("cli: a RAM-backed --dir is a runtime error and leaves nothing behind") {
  const auto before = list_dir("/dev/shm");
  Run r = run(std::string("train ") + kTiny + " --steps 1 --dir /dev/shm");
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("tmpfs") != std::string::npos);
  CHECK(r.output.find('\n') == r.output.size() - 1);  // one line
  CHECK(list_dir("/dev/shm") == before);
}

TEST_CASE("cli: a missing --dir is a runtime error") {
  ScratchDir dir;
  Run r = run(std::string("train ") + kTiny + " --steps 1 --dir " + dir.path() + "/missing");
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("does not exist") != std::string::npos);
}

TEST_CASE("cli: a capacity too small for the model is a runtime error naming the need") {
  ScratchDir dir;
  Run r = run(std::string("train ") + kTiny + " --steps 1 --capacity 4096 --dir " + dir.path());
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("--capacity 4096") != std::string::npos);
  CHECK(list_dir(dir.path()).empty());
}

TEST_CASE("cli: train gives identical losses in every mode and leaves no files") {
  ScratchDir dir;
  nlohmann::json none;
  REQUIRE(run_json(std::string("train ") + kTiny + " --steps 3 --json --mode none", &none).exit_code == 0);
  for (const char* mode : {"recompute", "ram", "disk", "per-file"}) {
    CAPTURE(mode);
    nlohmann::json j;
    Run r = run_json(std::string("train ") + kTiny + " --steps 3 --json --dir " + dir.path() +
                         " --mode " + mode, &j);
    CHECK(r.exit_code == 0);
    CHECK(j["losses"] == none["losses"]);
    CHECK(j["losses"].size() == 3);
  }
  CHECK(list_dir(dir.path()).empty());
}

TEST_CASE("cli: train reports the arena and the loss falls") {
  ScratchDir dir;
  nlohmann::json j;
  REQUIRE(run_json(std::string("train ") + kTiny + " --steps 25 --lr 1e-2 --json --dir " +
                       dir.path(), &j).exit_code == 0);
  CHECK(j["final_loss"].get<double>() < j["first_loss"].get<double>() - 1.0);
  CHECK(j["arena"]["bytes_in_use"] == 0);
  CHECK(j["arena"]["bytes_written"] == 25ull * 2 * 4 * 32 * 32 * 4);
  CHECK(j["arena"]["bytes_read"] == j["arena"]["bytes_written"]);
  CHECK(j["spilled_bytes_per_step"] == 2 * 4 * 32 * 32 * 4);
  CHECK(j["sample"].get<std::string>().rfind("And God said", 0) == 0);
}

TEST_CASE("cli: plan --json reports capacity, file system, fit and bandwidth") {
  ScratchDir dir;
  nlohmann::json j;
  Run r = run_json("plan --layers 4 --batch 2 --seq 128 --hidden 64 --dtype fp32 --layer-ms 5 "
                   "--probe-bytes 8MiB --json --dir " + dir.path(), &j);
  CHECK(r.exit_code == 0);
  CHECK(j["bytes_per_layer"] == 65536);
  CHECK(j["capacity_bytes"] == 4 * 65536);
  CHECK(j["fits"] == true);
  CHECK(j["ram_backed"] == false);
  CHECK_FALSE(j["file_system"].get<std::string>().empty());
  CHECK(j["probe"]["bytes"] == 8 << 20);
  CHECK(j["probe"]["write_GBps"].get<double>() > 0);
  CHECK(j["probe"]["read_GBps"].get<double>() > 0);
  CHECK(j.contains("keeps_up"));
  CHECK(j["problems"].empty());
  CHECK(list_dir(dir.path()).empty());
}

TEST_CASE("cli: plan on a RAM-backed or too small directory says so and exits 1") {
  nlohmann::json j;
  Run r = run_json("plan --layers 4 --batch 1 --seq 16 --hidden 16 --json --dir /dev/shm", &j);
  CHECK(r.exit_code == 1);
  CHECK(j["ram_backed"] == true);
  CHECK(j["fits"] == false);
  CHECK(j["probe"].is_null());
  ScratchDir dir;
  Run big = run("plan --layers 1000000 --batch 64 --seq 65536 --hidden 8192 --dir " + dir.path());
  CHECK(big.exit_code == 1);
  CHECK(big.output.find("fits         no") != std::string::npos);
  CHECK(big.output.find("free space there") != std::string::npos);
}
