// ferry-bench --peers: torch, jax and numpy timed on the same transfer cases, turn by turn with
// ferry's own runs, by bench/peers.py running as a server in a process of its own.
//
// Threading: a PeerSession is used by one thread (the benchmark's main thread); each call blocks
// until the Python process has answered.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "bench_case.h"
#include "ferry/core/status.h"

namespace ferry::bench {

// Whether bench/peers.py knows the case `case_name`.
bool HasPeers(std::string_view case_name);

// A row of bench/peers.py for `case_name` whose every peer is null, with `reason` as each
// peer's error.
Json PeerRowWithoutTimes(std::string_view case_name, const std::string& reason);

// Adds vs_<peer> (the peer's median time / ferry's median `seconds`: above 1 means ferry is that
// many times faster), the peer's median, how it was called, and, for a peer without a time,
// null and <peer>_error; the notes get "vs torch 1.30x jax 2.10x np 0.90x" and "<peer> n/a: why".
void AddPeerComparison(const Json& peers, double seconds, Json& json, std::string& notes);

// `python bench/peers.py --serve --size S`, one process for the whole benchmark run. For each
// case: Prepare (the peers build their source and destinations, warm up and check their result),
// then RunOnce after each of ferry's timed runs (every peer timed once, with a pause before each
// so that the other side's thread pools have gone idle), then Finish for the row.
//
// A session whose process failed (it could not start, exited, or printed what is not a reply)
// stays failed: every later call returns the same Internal error, which the case's row reports
// as each peer's reason.
class PeerSession {
 public:
  // Starts the process (a failed session when it cannot).
  // `jax_plugin`: a PJRT plugin library the jax peer puts onto instead of jax's own CPU device
  // (the plugin ferry's pjrt device runs on); empty for jax's own.
  static std::unique_ptr<PeerSession> Start(const std::string& python, double scale,
                                            const std::string& jax_plugin = {});
  ~PeerSession();  // closes its stdin and waits for it to exit
  PeerSession(const PeerSession&) = delete;
  PeerSession& operator=(const PeerSession&) = delete;

  Status Prepare(std::string_view case_name);
  Status RunOnce();
  // The case's row (the one-shot `peers.py --case NAME` prints the same).
  StatusOr<Json> Finish();
  // The process (its CPU time is ours, not other processes'); -1 when it did not start.
  pid_t pid() const { return pid_; }

 private:
  explicit PeerSession(std::string command) : command_(std::move(command)) {}

  // Sends one command line and reads the one-line JSON reply; a reply {"ok": false, "error"}
  // is an Internal error with that text (the session stays usable).
  StatusOr<Json> Call(const Json& command);

  pid_t pid_ = -1;
  FILE* channel_ = nullptr;  // our end of the socket that is the process's stdin and stdout
  std::string command_;      // for messages
  std::optional<Status> failed_;
};

}  // namespace ferry::bench
