"""perf_analyzer's output: the settings preamble, each level's Client and Server blocks, the closing
"Inferences/Second vs. Client ... Batch Latency" table, and the -f CSV with its exact columns (report_writer.cc).
Numbers print as C++ iostreams print them: doubles with 6 significant digits, times as whole usec."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import IO

from naiad.bench.control import ModelInfo
from naiad.bench.stats import PerfStatus, average_us, server_breakdown

Write = Callable[[str], None]


def g(value: float) -> str:
    """A double as `std::cout << value` prints it (%g, precision 6)."""
    return format(value, "g")


def preamble(out: Write, *, batch_size: int, measurement_mode: str, request_count: int, percentile: int,
             async_mode: bool, interval_ms: int, window_count: int, concurrency_end: int, rate_end: float,
             rate_mode: bool, latency_ms: int, concurrency_limit: int, rate_limit: float, distribution: str,
             binary: bool, decoupled: bool) -> None:
    out("*** Measurement Settings ***")
    out(f"  Batch size: {batch_size}")
    out("  Service Kind: TRITON")
    if request_count:
        out(f"  Sending {request_count} benchmark request{'s' if request_count > 1 else ''}")
    else:
        out(f'  Using "{measurement_mode}" mode for stabilization')
        metric = "throughput" if async_mode else "latency and throughput"
        out(f"  Stabilizing using average {metric}" if percentile == -1
            else f"  Stabilizing using p{percentile}{metric}")
        if measurement_mode == "time_windows":
            out(f"  Measurement window: {interval_ms} msec")
        else:
            out(f"  Minimum number of samples in each window: {window_count}")
    if not rate_mode and concurrency_end != 1:
        out(f"  Latency limit: {latency_ms} msec")
        if concurrency_end != 0:
            out(f"  Concurrency limit: {concurrency_limit} concurrent requests")
    if rate_mode and rate_end != 1.0:
        out(f"  Latency limit: {latency_ms} msec")
        if rate_end != 0:
            out(f"  Request Rate limit: {g(rate_limit)} requests per seconds")
    if rate_mode:
        out("  Using poisson distribution on request generation" if distribution == "poisson"
            else "  Using uniform distribution on request generation")
    if binary:
        out("  Using Binary Search algorithm")
    out("  Using asynchronous calls for inference" if async_mode else "  Using synchronous calls for inference")
    if decoupled:
        out("  Detected decoupled model, using the first response for measuring latency")
    out("")


def level_header(out: Write, status: PerfStatus, rate_mode: bool) -> None:
    if rate_mode:
        out(f"Request Rate: {g(status.request_rate)} inference requests per second")
    else:
        out(f"Request concurrency: {status.concurrency}")


def client_block(out: Write, status: PerfStatus, *, percentile: int, protocol: str, verbose: bool,
                 decoupled: bool) -> None:
    c = status.client
    out("  Client: ")
    out(f"    Request count: {c.request_count}")
    if c.request_count and c.delayed_request_count / c.request_count * 100 > 1.0:
        out(f"    Avg send request rate: {status.send_request_rate:.2f} infer/sec")
        out("    [WARNING] Perf Analyzer was not able to keep up with the desired request rate. "
            f"{c.delayed_request_count / c.request_count * 100:.2f}% of the requests were delayed. ")
    out(f"    Throughput: {g(c.infer_per_sec)} infer/sec")
    if decoupled:
        out(f"    Response Throughput: {g(c.responses_per_sec)} infer/sec")
    if percentile == -1:
        out(f"    Avg latency: {c.avg_latency_ns // 1000} usec (standard deviation {c.std_us} usec)")
    for p, value in c.percentile_latency_ns.items():
        out(f"    p{p} latency: {value // 1000} usec")
    if not decoupled:
        request_us = c.avg_request_time_ns // 1000
        send_us = c.avg_send_time_ns // 1000
        receive_us = c.avg_receive_time_ns // 1000
        wait_us = request_us - send_us - receive_us
        if protocol == "grpc":
            detail = (f"marshal {send_us} usec + response wait {wait_us} usec + unmarshal {receive_us} usec)"
                      if verbose else
                      f"(un)marshal request/response {send_us + receive_us} usec + response wait {wait_us} usec)")
            out(f"    Avg gRPC time: {request_us} usec ({detail}")
        else:
            detail = (f"send {send_us} usec + response wait {wait_us} usec + receive {receive_us} usec)"
                      if verbose else f"send/recv {send_us + receive_us} usec + response wait {wait_us} usec)")
            out(f"    Avg HTTP time: {request_us} usec ({detail}")
    else:
        out("    ")


def _server_model(out: Write, server: dict[str, int], indent: str, cache: bool, name: str) -> None:
    count = server.get("success_count", 0)
    if count == 0:
        out(f"{indent}  Request count: {count}")
        return
    out(f"{indent}  Inference count: {server.get('inference_count', 0)}")
    out(f"{indent}  Execution count: {server.get('execution_count', 0)}")
    if cache:
        out(f"{indent}  Cache hit count: {server.get('cache_hit_count', 0)}")
        out(f"{indent}  Cache miss count: {server.get('cache_miss_count', 0)}")
    b = server_breakdown(server)
    head = f"{indent}  Successful request count: {count}\n{indent}  Avg request latency: {b['request']} usec"
    if cache:
        out(f"{head} (overhead {b['overhead_cache']} usec + queue {b['queue']} usec + cache hit/miss "
            f"{b['combined_cache_compute']} usec)")
        out(f"{indent}{indent}  Average Cache Hit Latency: {b['cache_hit']} usec")
        out(f"{indent}{indent}  Average Cache Miss Latency: {b['cache_miss'] + b['compute']} usec (cache "
            f"lookup/insertion {b['cache_miss']} usec + compute input {b['compute_input']} usec + compute infer "
            f"{b['compute_infer']} usec + compute output {b['compute_output']} usec)")
    else:
        out(f"{head} (overhead {b['overhead']} usec + queue {b['queue']} usec + compute input "
            f"{b['compute_input']} usec + compute infer {b['compute_infer']} usec + compute output "
            f"{b['compute_output']} usec)")
        if b["cache_hit"] > 0 or b["cache_miss"] > 0:
            print(f"Response Cache is disabled for model [{name}] but cache hit/miss latency is non-zero.",
                  file=sys.stderr)


def server_block(out: Write, status: PerfStatus, model: ModelInfo) -> None:
    out("  Server: ")
    if not status.composing:
        _server_model(out, status.server, "  ", model.response_cache, model.name)
        return
    server = status.server
    count = server.get("success_count", 0)
    if count == 0:
        out(f"    Request count: {count}")
        return
    queue = sum(average_us(s.get("queue_ns", 0), s.get("queue_count", 0)) for s in status.composing.values())
    compute = sum(server_breakdown(s)["compute"] for s in status.composing.values())
    request = average_us(server.get("success_ns", 0), count)
    out(f"    Inference count: {server.get('inference_count', 0)}")
    out(f"    Execution count: {server.get('execution_count', 0)}")
    out(f"    Successful request count: {count}")
    out(f"    Avg request latency: {request} usec (overhead {max(0, request - queue - compute)} usec + queue "
        f"{queue} usec + compute {compute} usec)")
    out("")
    out("  Composing models: ")
    for name, stats in status.composing.items():
        out(f"  {name}, version: ")
        _server_model(out, stats, "    ", False, name)


def metrics_block(out: Write, metrics: dict[str, dict[str, float]]) -> None:
    out("  Server Prometheus Metrics: ")
    out("    Avg GPU Utilization:")
    for uuid, value in metrics.get("nv_gpu_utilization", {}).items():
        out(f"      {uuid} : {g(value * 100.0)}%")
    out("    Avg GPU Power Usage:")
    for uuid, value in metrics.get("nv_gpu_power_usage", {}).items():
        out(f"      {uuid} : {g(value)} watts")
    out("    Max GPU Memory Usage:")
    for uuid, value in metrics.get("nv_gpu_memory_used_bytes", {}).items():
        out(f"      {uuid} : {int(value)} bytes")
    out("    Total GPU Memory:")
    for uuid, value in metrics.get("nv_gpu_memory_total_bytes", {}).items():
        out(f"      {uuid} : {int(value)} bytes")
    # Beyond perf_analyzer: the CPU gauges, which on a CPU host are the ones that matter.
    if "nv_cpu_utilization" in metrics:
        out(f"    Avg CPU Utilization: {g(metrics['nv_cpu_utilization'].get('', 0.0) * 100.0)}%")
    if "nv_cpu_memory_used_bytes" in metrics:
        out(f"    Max CPU Memory Usage: {int(metrics['nv_cpu_memory_used_bytes'].get('', 0))} bytes")


def summary(out: Write, statuses: list[PerfStatus], percentile: int, rate_mode: bool) -> None:
    out("Inferences/Second vs. Client " + ("Average Batch Latency" if percentile == -1
                                           else f"p{percentile} Batch Latency"))
    for status in statuses:
        level = f"Request Rate: {g(status.request_rate)}, " if rate_mode else f"Concurrency: {status.concurrency}, "
        out(f"{level}throughput: {g(status.client.infer_per_sec)} infer/sec, latency "
            f"{status.stabilizing_latency_ns // 1000} usec")


# --- CSV ------------------------------------------------------------------------------------------------------

def csv_header(*, concurrency_mode: bool, decoupled: bool, server_stats: bool, cache: bool,
               percentiles: list[int], verbose_csv: bool, percentile: int, metrics: bool) -> list[str]:
    columns = ["Concurrency" if concurrency_mode else "Request Rate", "Inferences/Second"]
    if decoupled:
        columns.append("Response Throughput")
    columns.append("Client Send")
    if server_stats:
        columns += ["Network+Server Send/Recv", "Server Queue", "Server Compute Input", "Server Compute Infer",
                    "Server Compute Output"]
        if cache:
            columns += ["Server Cache Hit", "Server Cache Miss"]
    columns.append("Client Recv")
    columns += [f"p{p} latency" for p in percentiles]
    if verbose_csv:
        if percentile == -1:
            columns.append("Avg latency")
        columns += ["request/response", "response wait"]
        if metrics:
            columns += ["Avg GPU Utilization", "Avg GPU Power Usage", "Max GPU Memory Usage", "Total GPU Memory"]
    return columns


def _gpu_cells(metrics: dict[str, dict[str, float]]) -> list[str]:
    cells = []
    for name in ("nv_gpu_utilization", "nv_gpu_power_usage", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"):
        values = metrics.get(name, {})
        cells.append("".join(f"{uuid}:{g(v) if isinstance(v, float) and not v.is_integer() else int(v)};"
                             for uuid, v in values.items()))
    return cells


def write_csv(stream: IO[str], statuses: list[PerfStatus], *, concurrency_mode: bool, model: ModelInfo,
              server_stats: bool, verbose_csv: bool, percentile: int, metrics: bool) -> None:
    if not statuses:
        return
    percentiles = list(statuses[0].client.percentile_latency_ns)
    header = csv_header(concurrency_mode=concurrency_mode, decoupled=model.decoupled, server_stats=server_stats,
                        cache=model.response_cache, percentiles=percentiles, verbose_csv=verbose_csv,
                        percentile=percentile, metrics=metrics)
    # Levels reported although not stable: two columns more (perf_analyzer's readers go by column name)
    partial = any(not status.stable for status in statuses)
    if partial:
        header += ["Stable", "Note"]
    stream.write(",".join(header) + "\n")
    for status in sorted(statuses, key=lambda s: s.client.infer_per_sec):
        c = status.client
        row = [str(status.concurrency) if concurrency_mode else g(status.request_rate), g(c.infer_per_sec)]
        if model.decoupled:
            row.append(g(c.responses_per_sec))
        row.append(str(c.avg_send_time_ns // 1000))
        if server_stats:
            b = server_breakdown(status.server)
            sv = status.server

            def avg_ns(key: str, count_key: str) -> int:
                return sv.get(key, 0) // sv[count_key] if sv.get(count_key) else 0

            compute_count = sv.get("compute_input_count", 0)
            compute_ns = ((sv.get("compute_input_ns", 0) + sv.get("compute_infer_ns", 0)
                           + sv.get("compute_output_ns", 0)) // compute_count if compute_count else 0)
            # In ns, as report_writer.cc does, then whole usec.
            wait_ns = c.avg_latency_ns - c.avg_send_time_ns - c.avg_receive_time_ns
            accounted_ns = (avg_ns("queue_ns", "queue_count") + compute_ns + avg_ns("cache_hit_ns", "cache_hit_count")
                            + avg_ns("cache_miss_ns", "cache_miss_count"))
            network_us = max(0, wait_ns - accounted_ns) // 1000
            if wait_ns <= accounted_ns:
                print("Server average accounted time was larger than client average wait time due to small sample "
                      "size. Increase the measurement interval with `--measurement-interval`.", file=sys.stderr)
            row += [str(network_us), str(b["queue"]), str(b["compute_input"]), str(b["compute_infer"]),
                    str(b["compute_output"])]
            if model.response_cache:
                row += [str(b["cache_hit"]), str(b["cache_miss"])]
        row.append(str(c.avg_receive_time_ns // 1000))
        row += [str(c.percentile_latency_ns.get(p, 0) // 1000) for p in percentiles]
        if verbose_csv:
            if percentile == -1:
                row.append(str(c.avg_latency_ns // 1000))
            send_us, receive_us = c.avg_send_time_ns // 1000, c.avg_receive_time_ns // 1000
            row.append(str(send_us + receive_us))
            row.append(str(c.avg_request_time_ns // 1000 - send_us - receive_us))
            if metrics:
                row += _gpu_cells(status.metrics)
        if partial:
            row += ["1" if status.stable else "0", '"' + status.note.replace('"', "'") + '"']
        stream.write(",".join(row) + "\n")


def write_composing_csv(stream: IO[str], name: str, statuses: list[PerfStatus], *, concurrency_mode: bool,
                        cache: bool) -> None:
    """An ensemble step's file (<model>_v<version>.<file>), in the ensemble file's layout."""
    columns = ["Concurrency" if concurrency_mode else "Request Rate", "Inferences/Second", "Client Send",
               "Network+Server Send/Recv", "Server Queue", "Server Compute Input", "Server Compute Infer",
               "Server Compute Output"] + (["Server Cache Hit", "Server Cache Miss"] if cache else []) + ["Client Recv"]
    stream.write(",".join(columns) + "\n")
    for status in statuses:
        stats = status.composing.get(name, {})
        b = server_breakdown(stats)
        top = status.server.get("success_count", 0)
        ratio = stats.get("success_count", 0) / top if top else 0.0
        overhead = max(0, b["request"] - (b["queue"] + b["compute"] + b["cache_hit"] + b["cache_miss"]))
        row = [str(status.concurrency) if concurrency_mode else g(status.request_rate),
               g(ratio * status.client.infer_per_sec), "0", str(overhead), str(b["queue"]), str(b["compute_input"]),
               str(b["compute_infer"]), str(b["compute_output"])]
        if cache:
            row += [str(b["cache_hit"]), str(b["cache_miss"])]
        row.append("0")
        stream.write(",".join(row) + "\n")
