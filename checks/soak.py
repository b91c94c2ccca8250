"""The soak's checks: a ``preflight soak`` run (or any ``preflight-soak/1`` directory) judged.

Each gets the soak's ``SoakContext`` (preflight/soak/context.py): the figures worked out once
for the whole soak, and the built-in verdicts as its ``judge_*`` methods, which hold the
thresholds and the words (preflight/soak/gpu_verdicts.py, throughput.py and server_log.py
document them). A check here says which hosts its verdict covers. Checks may not import
preflight.soak (tests/test_layers.py), hence the methods.

The findings come out host by host, as the soak's report always had them
(preflight/soak/analysis.py says the order); the definitions below are in that order.
"""

from preflight.check import error, skip, soak_check
from preflight.contracts import SOAK_JSON, TELEMETRY_CSV


@soak_check("soak-thermal", summary="no GPU held a thermal slowdown reason or its slowdown temperature "
            "for more than a few seconds (thermal-throttling)")
def soak_thermal(soak):
    return [soak.judge_thermal(host) for host in soak.sampled_hosts]


@soak_check("soak-power", summary="power capping at load is how a GPU runs; the SM clock held below its "
            "floor under the cap, the HW power brake, or unexplained HW slowdown is not (power-capping)")
def soak_power(soak):
    return [soak.judge_power(host) for host in soak.sampled_hosts]


@soak_check("soak-throughput", summary="throughput against its baseline: a sustained cliff "
            "(throughput-cliff) or a decay by the end (throughput-decay)")
def soak_throughput(soak):
    # A host excused from GPU telemetry (vLLM on the CPU) is judged on its throughput alone.
    return [soak.judge_throughput(host) for host in soak.hosts
            if soak.gpus[host] or host in soak.no_telemetry]


@soak_check("soak-outliers", summary="no GPU runs hotter or slower than the median of its node or "
            "the fleet (gpu-outlier)")
def soak_outliers(soak):
    return [soak.judge_outliers(host) for host in soak.sampled_hosts]


@soak_check("soak-telemetry", summary="every host's agent finished and covered the planned length "
            "(soak-incomplete), has GPU telemetry and every GPU kept reporting to the end "
            "(gpu-fallen-off-bus); gaps are noted")
def soak_telemetry(soak):
    if not soak.hosts:
        yield error(f"no host in {SOAK_JSON}, the telemetry or the agents' record: nothing was soaked")
    for host in soak.hosts:
        # A soak that stopped early or whose agent died is not a pass, whatever its samples say.
        short = soak.judge_coverage(host)
        if short is not None:
            yield short
        elif soak.gpus[host]:
            yield soak.judge_telemetry(host)
        elif host in soak.no_telemetry:
            yield skip(f"no GPU telemetry: {soak.no_telemetry[host]}; temperature, clocks and power not judged",
                       host=host)
        else:
            yield error(f"no telemetry samples for this host in {TELEMETRY_CSV}: not judged", host=host)


@soak_check("soak-memory", summary="GPU memory used does not keep growing under a steady load "
            "(gpu-memory-growth)")
def soak_memory(soak):
    return [soak.judge_memory(host) for host in soak.sampled_hosts]


@soak_check("soak-latency", summary="a served model's TTFT/TPOT percentiles and error rate per window "
            "within the --slo limits (slo-violated), and no latency that doubles while throughput "
            "holds (latency-drift)")
def soak_latency(soak):
    # Only a served model has requests to time; the burn's windows are TFLOP/s.
    if soak.engine == "burn":
        return []
    return [soak.judge_latency(host) for host in soak.hosts if not soak.throughput[host].empty]


@soak_check("soak-sweep", summary="a concurrency sweep's levels (tokens/s, TTFT/TPOT P50/P99, errors, goodput), "
            "its knee and the level to serve at; a node whose curve is unlike the fleet's (sweep-curve-outlier)")
def soak_sweep(soak):
    return [soak.judge_sweep(host) for host in soak.swept_hosts]


@soak_check("soak-sdc", summary="the burn's GEMM on fixed inputs gave the same result all along and on "
            "every GPU of the node (gpu-silent-data-corruption)")
def soak_sdc(soak):
    # Only the burn computes on fixed inputs; a served model's output has nothing to compare with.
    if soak.engine != "burn":
        return []
    return [soak.judge_sdc(host) for host in soak.hosts if not soak.throughput[host].empty]


@soak_check("soak-ib-counters", summary="RDMA error counters do not grow across the soak and no link flaps "
            "(readings before, every --ib-interval during, and after the load; ib-link-flapping, ib-link-errors, "
            "ib-fabric-congestion, ib-host-buffer-exhausted)")
def soak_ib_counters(soak):
    # Only where the agents read the counters (ib-counters.txt); a soak assembled from other
    # telemetry has none, and says nothing about the fabric.
    if not soak.ib_readings:
        return []
    return [soak.judge_ib_counters(host) for host in soak.hosts]


@soak_check("soak-vllm-server", summary="no known failure in a vllm soak's server log (CUDA graph "
            "capture, illegal memory access, no KV-cache memory, out of memory, engine died)")
def soak_vllm_server(soak):
    return soak.judge_server_log()
