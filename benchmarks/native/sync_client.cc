// The SYNC section's producers in C++ (benchmarks/native_client.py builds and runs it).
//
// N producers on one channel, each with one message outstanding: it sends a message,
// waits for the ack, then sends the next — a Send call per message (--call send), or one
// SendStream per producer carrying one message per request (--call stream). One thread
// drives every producer from one completion queue, as a RocketMQ client drives its
// producers from one connection and one I/O thread, so that the load costs the 2-core
// machine little of what the writer under test needs (a Python client spends about a
// core on the same load).
//
// The requests are serialized already (--requests: each a little-endian u32 length and
// that many bytes, from the benchmark's seeded workload) and go through grpc's generic
// stub: no protobuf code is generated or linked. Producer p sends requests p, p + N, …
// round the file. Acks taken in the --warmup seconds are not counted; after --seconds
// more, each producer stops (a stream half-closes and must end OK).
//
// Prints one JSON document: producers, call, acked, seconds, errors, latencies_ns (the
// same fields as grpc_clients.py sync).

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kSend = "/rmqstore.v1.WriterService/Send";
constexpr const char* kSendStream = "/rmqstore.v1.WriterService/SendStream";
constexpr std::size_t kErrorsKept = 5;

struct Options {
  std::string endpoint;
  std::string requests;
  bool stream = true;
  int producers = 0;
  double seconds = 0;
  double warmup = 0.5;
  double timeout = 600;
};

// What a completion-queue tag asks for; the low bits of a Producer pointer carry it.
enum Step : std::uintptr_t { kStarted, kWritten, kRead, kHalfClosed, kFinished, kAnswered };

struct Producer {
  std::size_t next_request = 0;
  Clock::time_point sent_at;
  Clock::time_point acked_at;
  // A stream may have one write outstanding: the next message (or the half-close) waits
  // for the write's completion as well as for the ack, which can come first.
  bool writing = false;
  bool acked = false;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> unary;
  grpc::ByteBuffer reply;
  grpc::Status status;
};

void* TagOf(Producer* producer, Step step) {
  return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(producer) | step);
}

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "sync_client: %s\n", why.c_str());
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) Fail(std::string("no value for ") + argv[i]);
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--endpoint") options.endpoint = value;
    else if (flag == "--requests") options.requests = value;
    else if (flag == "--call" && (value == "send" || value == "stream")) options.stream = value == "stream";
    else if (flag == "--producers") options.producers = std::atoi(value.c_str());
    else if (flag == "--seconds") options.seconds = std::atof(value.c_str());
    else if (flag == "--warmup") options.warmup = std::atof(value.c_str());
    else if (flag == "--timeout") options.timeout = std::atof(value.c_str());
    else Fail("unknown option " + flag + " " + value);
  }
  if (options.endpoint.empty() || options.requests.empty() || options.producers <= 0 || options.seconds <= 0) {
    Fail("usage: sync_client --endpoint HOST:PORT --requests FILE --call send|stream --producers N --seconds S");
  }
  return options;
}

std::vector<grpc::ByteBuffer> ReadRequests(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail("cannot open " + path);
  std::vector<grpc::ByteBuffer> requests;
  unsigned char prefix[4];
  while (in.read(reinterpret_cast<char*>(prefix), 4)) {
    std::uint32_t length = prefix[0] | prefix[1] << 8 | prefix[2] << 16 | std::uint32_t(prefix[3]) << 24;
    std::string bytes(length, '\0');
    if (!in.read(bytes.data(), length)) Fail(path + " ends inside a request");
    grpc::Slice slice(bytes);
    requests.emplace_back(&slice, 1);
  }
  if (requests.empty()) Fail(path + " holds no request");
  return requests;
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) out += ' ';
    else out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = Parse(argc, argv);
  const std::vector<grpc::ByteBuffer> requests = ReadRequests(options.requests);
  auto channel = grpc::CreateChannel(options.endpoint, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
    Fail("cannot connect to " + options.endpoint);
  }
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue queue;

  const auto began = Clock::now();
  const auto counted_from = began + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.warmup));
  const auto stop_at = counted_from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.seconds));
  // grpc takes deadlines on the system clock.
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(options.timeout));
  std::vector<std::int64_t> latencies_ns;
  std::vector<std::string> errors;
  auto note_error = [&](const grpc::Status& status) {
    if (errors.size() < kErrorsKept) errors.push_back(std::to_string(status.error_code()) + ": " + status.error_message());
  };

  std::vector<std::unique_ptr<Producer>> producers;
  auto send_next = [&](Producer* producer) {
    const grpc::ByteBuffer& request = requests[producer->next_request % requests.size()];
    producer->next_request += options.producers;
    producer->sent_at = Clock::now();
    if (options.stream) {
      producer->writing = true;
      producer->acked = false;
      producer->stream->Write(request, TagOf(producer, kWritten));
      producer->stream->Read(&producer->reply, TagOf(producer, kRead));
    } else {
      producer->context = std::make_unique<grpc::ClientContext>();
      producer->context->set_deadline(deadline);
      producer->unary = stub.PrepareUnaryCall(producer->context.get(), kSend, request, &queue);
      producer->unary->StartCall();
      producer->unary->Finish(&producer->reply, &producer->status, TagOf(producer, kAnswered));
    }
  };
  for (int p = 0; p < options.producers; ++p) {
    auto producer = std::make_unique<Producer>();
    producer->next_request = p;
    if (options.stream) {
      producer->context = std::make_unique<grpc::ClientContext>();
      producer->context->set_deadline(deadline);
      producer->stream = stub.PrepareCall(producer->context.get(), kSendStream, &queue);
      producer->stream->StartCall(TagOf(producer.get(), kStarted));
    } else {
      send_next(producer.get());
    }
    producers.push_back(std::move(producer));
  }

  int running = options.producers;
  void* tag;
  bool ok;
  while (running > 0 && queue.Next(&tag, &ok)) {
    auto* producer = reinterpret_cast<Producer*>(reinterpret_cast<std::uintptr_t>(tag) & ~std::uintptr_t{7});
    const auto step = static_cast<Step>(reinterpret_cast<std::uintptr_t>(tag) & 7);
    bool done = false;  // the message is acked and its producer free to go on
    switch (step) {
      case kStarted:
        if (ok) send_next(producer);
        else producer->stream->Finish(&producer->status, TagOf(producer, kFinished));
        break;
      case kWritten:
        producer->writing = false;  // a failed write shows in its read
        done = producer->acked;
        break;
      case kRead:
        if (ok) {  // any reply is the ack (an empty message too: the no-op server's)
          producer->acked = true;
          producer->acked_at = Clock::now();
          done = !producer->writing;
        } else {
          producer->stream->Finish(&producer->status, TagOf(producer, kFinished));  // the stream ended early
        }
        break;
      case kHalfClosed:
        producer->stream->Finish(&producer->status, TagOf(producer, kFinished));
        break;
      case kFinished:
        if (!producer->status.ok()) note_error(producer->status);
        else if (Clock::now() < stop_at) note_error(grpc::Status(grpc::StatusCode::UNKNOWN, "the stream ended before its time"));
        --running;
        break;
      case kAnswered:
        if (producer->status.ok()) {
          producer->acked_at = Clock::now();
          done = true;
        } else {
          note_error(producer->status);
          --running;
        }
        break;
    }
    if (!done) continue;
    if (producer->sent_at >= counted_from) {
      latencies_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(producer->acked_at - producer->sent_at).count());
    }
    if (Clock::now() < stop_at) send_next(producer);
    else if (options.stream) producer->stream->WritesDone(TagOf(producer, kHalfClosed));
    else --running;
  }

  std::printf("{\"producers\": %d, \"call\": \"%s\", \"acked\": %zu, \"seconds\": %g, \"errors\": [", options.producers,
              options.stream ? "stream" : "send", latencies_ns.size(), options.seconds);
  for (std::size_t i = 0; i < errors.size(); ++i) std::printf("%s%s", i ? ", " : "", JsonString(errors[i]).c_str());
  std::printf("], \"latencies_ns\": [");
  for (std::size_t i = 0; i < latencies_ns.size(); ++i) std::printf("%s%lld", i ? ", " : "", static_cast<long long>(latencies_ns[i]));
  std::printf("]}\n");
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  return 0;
}
