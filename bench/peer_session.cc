#include "peer_session.h"

#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>
#include <vector>

#include "fmt/format.h"

extern char** environ;

namespace ferry::bench {
namespace {

// The cases bench/peers.py knows.
constexpr const char* kPeerCases[] = {
    "h2d_contiguous",      "h2d_transposed",      "h2d_strided_slice", "h2d_convert_f32_bf16",
    "h2d_convert_f64_f32", "h2d_convert_f32_f16", "d2h_contiguous",    "d2h_upcast_bf16_f32"};

// bench/peers.py's peers: the name in its fields and in the JSON (vs_<field>), and in the notes.
struct PeerName {
  const char* field;
  const char* note;
};
constexpr PeerName kPeers[] = {{"torch", "torch"}, {"jax", "jax"}, {"numpy", "np"}};

}  // namespace

bool HasPeers(std::string_view case_name) {
  return std::any_of(std::begin(kPeerCases), std::end(kPeerCases),
                     [&](const char* name) { return case_name == name; });
}

Json PeerRowWithoutTimes(std::string_view case_name, const std::string& reason) {
  Json row = {{"case", case_name}};
  for (const PeerName& peer : kPeers) {
    row[fmt::format("{}_seconds_median", peer.field)] = nullptr;
    row[fmt::format("{}_error", peer.field)] = reason;
  }
  return row;
}

void AddPeerComparison(const Json& peers, double seconds, Json& json, std::string& notes) {
  std::string ratios;
  std::vector<std::string> missing;  // "<peer> n/a: why"
  std::vector<std::string> reasons;
  for (const PeerName& peer : kPeers) {
    const std::string median_key = fmt::format("{}_seconds_median", peer.field);
    const std::string error_key = fmt::format("{}_error", peer.field);
    const std::string method_key = fmt::format("{}_method", peer.field);
    const std::string ratio_key = fmt::format("vs_{}", peer.field);
    const Json median = peers.value(median_key, Json(nullptr));
    if (!median.is_number()) {
      const std::string reason = peers.value(error_key, std::string("not measured"));
      json[ratio_key] = nullptr;
      json[median_key] = nullptr;
      json[error_key] = reason;
      missing.push_back(fmt::format("{} n/a: {}", peer.note, reason));
      reasons.push_back(reason);
      continue;
    }
    const double ratio = median.get<double>() / seconds;
    json[ratio_key] = ratio;
    json[median_key] = median;
    if (peers.contains(method_key)) json[method_key] = peers[method_key];
    const std::string all_key = fmt::format("{}_seconds_all", peer.field);
    if (peers.contains(all_key)) json[all_key] = peers[all_key];
    ratios += fmt::format(" {} {:.2f}x", peer.note, ratio);
    if (std::string_view(peer.field) == "jax" && peers.value("jax_aliased", false)) {
      json["jax_aliased"] = true;
      ratios += " (aliased: no copy)";
    }
  }
  if (!ratios.empty()) AddNote(notes, "vs" + ratios);
  // One reason for all the peers (peers.py failed) is said once.
  if (reasons.size() == std::size(kPeers) &&
      std::all_of(reasons.begin(), reasons.end(), [&](const auto& r) { return r == reasons[0]; })) {
    AddNote(notes, fmt::format("peers n/a: {}", reasons[0]));
    return;
  }
  for (const std::string& note : missing) AddNote(notes, note);
}

std::unique_ptr<PeerSession> PeerSession::Start(const std::string& python, double scale,
                                                const std::string& jax_plugin) {
  const std::string script = fmt::format("{}/bench/peers.py", FERRY_SOURCE_DIR);
  const std::string size = fmt::format("{}", scale);
  auto session = std::unique_ptr<PeerSession>(
      new PeerSession(fmt::format("{} {} --serve --size {}", python, script, size)));
  // One socket pair as the child's stdin and stdout: writes to a socket can ask for no SIGPIPE
  // (MSG_NOSIGNAL), so a child that died is an error here rather than the end of ferry-bench.
  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) != 0) {
    session->failed_ = InternalError(
        fmt::format("socketpair for {}: {}", session->command_, std::strerror(errno)));
    return session;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sockets[1], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, sockets[1], STDOUT_FILENO);
  std::vector<std::string> arguments = {python, script, "--serve", "--size", size};
  if (!jax_plugin.empty()) {
    arguments.push_back("--jax-plugin");
    arguments.push_back(jax_plugin);
  }
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  const int spawned =
      posix_spawnp(&session->pid_, python.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(sockets[1]);
  if (spawned != 0) {
    close(sockets[0]);
    session->pid_ = -1;
    session->failed_ =
        InternalError(fmt::format("cannot run {}: {}", session->command_, std::strerror(spawned)));
    return session;
  }
  session->channel_ = fdopen(sockets[0], "r");
  if (session->channel_ == nullptr) {
    close(sockets[0]);
    session->failed_ =
        InternalError(fmt::format("fdopen for {}: {}", session->command_, std::strerror(errno)));
  }
  return session;
}

PeerSession::~PeerSession() {
  if (channel_ != nullptr) {
    shutdown(fileno(channel_), SHUT_WR);  // the server's stdin ends: it exits
    std::fclose(channel_);
  }
  if (pid_ > 0) waitpid(pid_, nullptr, 0);
}

StatusOr<Json> PeerSession::Call(const Json& command) {
  if (failed_.has_value()) return *failed_;
  const std::string line = command.dump() + "\n";
  for (size_t sent = 0; sent < line.size();) {
    const ssize_t n = send(fileno(channel_), line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      failed_ = InternalError(
          fmt::format("{}: stopped taking commands ({})", command_, std::strerror(errno)));
      return *failed_;
    }
    sent += static_cast<size_t>(n);
  }
  char* reply_line = nullptr;
  size_t capacity = 0;
  const ssize_t length = getline(&reply_line, &capacity, channel_);
  const std::string reply_text = length > 0 ? std::string(reply_line, length) : std::string();
  std::free(reply_line);
  if (length <= 0) {
    failed_ = InternalError(fmt::format("{} exited during '{}'", command_, command.dump()));
    return *failed_;
  }
  Json reply = Json::parse(reply_text, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded() || !reply.is_object()) {
    failed_ = InternalError(fmt::format("{} answered '{}' with what is not JSON: {}", command_,
                                        command.dump(), reply_text.substr(0, 200)));
    return *failed_;
  }
  if (!reply.value("ok", true)) {
    return InternalError(fmt::format("bench/peers.py: {}", reply.value("error", "failed")));
  }
  return reply;
}

Status PeerSession::Prepare(std::string_view case_name) {
  return Call({{"op", "prepare"}, {"case", case_name}}).status();
}

Status PeerSession::RunOnce() { return Call({{"op", "run"}}).status(); }

StatusOr<Json> PeerSession::Finish() { return Call({{"op", "finish"}}); }

}  // namespace ferry::bench
