"""checks/xid.py and preflight/knowledge/xid_catalog.py on the real kernel-log corpus. Synthetic lines are
real corpus lines with one value changed, or lines quoted in docs/sources.md §5.1; each says which."""

from pathlib import Path

import pytest
from ctx import make_host, result, run_check

from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.knowledge.xid_catalog import XidCatalogError, load_xid_catalog
from preflight.model import Status

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
LOGS = CORPUS / "kernel-log"


def log(name: str) -> str:
    return (LOGS / name).read_text()


def xid(text: str):
    return run_check("xid", make_host({"kernel-log": text}))


# ---- the catalog ----------------------------------------------------------------------------

def test_every_cause_the_catalog_names_is_in_the_knowledge_base():
    catalog, kb = load_xid_catalog(), load_knowledge()
    named = {e.cause for e in catalog.entries.values()} | set(catalog.causes)
    assert named - set(kb.causes) == set()
    assert {"gpu-app-fault", "gpu-xid", "gpu-gsp-error", "gpu-ecc-correctable-rate", "gpu-c2c-errors",
            "gpu-recovery-action"} <= named


def test_catalog_entries_are_typed_and_read_once():
    catalog = load_xid_catalog()
    assert load_xid_catalog() is catalog
    e79 = catalog.get(79)
    assert (e79.mnemonic, e79.action, e79.severity, e79.cause) == (
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "fatal", "gpu-fallen-off-bus")
    assert e79.action_meaning == "Full power cycle of the node."
    assert catalog.get(14) is None and catalog.get(None) is None


def test_every_reset_gpu_xid_is_fatal_except_the_intentional_nvlink_down():
    # NVIDIA's RESET_GPU bucket means the GPU cannot be trusted until reset: xid.yaml's "fatal".
    # Xid 155 is a link-down that software flagged as intentional (docs/sources.md §5.3).
    catalog = load_xid_catalog()
    not_fatal = {code for code, e in catalog.entries.items() if e.action == "RESET_GPU" and e.severity != "fatal"}
    assert not_fatal == {155}
    assert catalog.get(156).severity == "fatal"


def test_xid156_resource_retirement_fails():
    # The real Xid 63 line of the corpus with its number changed to 156 (a retirement a reset applies).
    line = log("a100-xid63-row-remapper-pending.txt").replace("): 63,", "): 156,")
    [f] = xid(line)
    assert (f.status, f.symptoms) == (Status.FAIL, ("gpu-xid", "xid-156"))
    assert "RESET_GPU" in f.action


def test_a_catalog_entry_with_an_unknown_severity_is_refused(tmp_path):
    bad = tmp_path / "xid.yaml"
    bad.write_text((CORPUS.parent.parent.parent / "playbooks" / "xid.yaml").read_text()
                   .replace("severity: fatal", "severity: deadly", 1))
    with pytest.raises(XidCatalogError, match=r"xid.yaml: Xid 46: severity must be one of"):
        load_xid_catalog(bad)


# ---- real kernel logs -----------------------------------------------------------------------

def test_healthy_h200_boot_log_passes():
    # The dmesg tail captured on the H200 VM (the "[" lines of its probe log): driver load only.
    probe = (CORPUS / "h200-vm" / "probe.log").read_text().splitlines()
    [f] = xid("\n".join(line for line in probe if line.startswith("[")))
    assert f.status is Status.PASS and f.summary == "no Xid, SXid or GPU driver error in 5 kernel-log lines"


@pytest.mark.parametrize("name", ["ghes-apei-pcie-error-recoverable-with-edac-ue.txt",
                                  "mlx5-cx4lx-handle-hca-cap-failed-probe-error-22.txt",
                                  "mlx5-health-compromised-irisc-not-responding-cx6-fw20.txt",
                                  "mlx5-vdpa-disagrees-about-version-of-symbol-ofed-inbox-mismatch.txt",
                                  "h100-dmesg-pcie-bandwidth-limited-by-gen4-switch.txt"])
def test_logs_without_gpu_errors_pass(name):
    [f] = xid(log(name))
    assert f.status is Status.PASS and f.summary.startswith("no Xid, SXid or GPU driver error in")
    # These are excerpts: nothing shows the log reaches back to the driver's load at boot.
    assert "no NVRM driver-load line: the log may not reach back to boot" in f.summary


def test_excerpt_note_is_carried_into_the_summary():
    [f] = xid(log("h100-dmesg-pcie-bandwidth-limited-by-gen4-switch.txt"))
    assert "'[...]' marks an elided part; the log is an excerpt" in f.summary


def test_xid63_pending_remap_warns_and_leaves_the_action_to_the_cause():
    [f] = xid(log("a100-xid63-row-remapper-pending.txt"))
    assert (f.status, f.symptoms) == (Status.WARN, ("gpu-row-remap", "xid-63"))
    assert f.summary.startswith("Xid 63 INFOROM_DRAM_RETIREMENT_EVENT on 0000:10:1c, 1 line: ECC handling")
    assert f.evidence[0].excerpt.startswith("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper")
    # NVIDIA's bucket for 63 is IGNORE; "no action" would mislead, so the cause's action is used.
    assert "action" not in f.data
    [d] = diagnose([f], load_knowledge())
    assert d.cause == "gpu-row-remap" and d.action.startswith("Pending: drain, reset the GPU")


def test_xid94_contained_ecc_warns_with_restart_app():
    [f] = xid(log("h100-xid94-contained-ecc-ch-only.txt"))
    assert (f.status, f.symptoms) == (Status.WARN, ("gpu-ecc-uncorrectable", "xid-94"))
    assert f.action.startswith("Xid 94 on 0000:0f:00 (RESTART_APP): Restart the application")


def test_xid145_nonfatal_nvlink5_warns():
    [f] = xid(log("xid145-rlw-rxpipe-nonfatal-nvlink5-single-line.txt"))
    assert (f.status, f.symptoms) == (Status.WARN, ("nvlink-errors", "xid-145"))
    assert "Xid 145 NVLINK_RLW_ERROR on 0018:01:00" in f.summary


def test_xid145_printed_fatal_fails():
    # Synthetic: the same real line with "Nonfatal" changed to "Fatal" (the other form NVLink5 prints).
    [f] = xid(log("xid145-rlw-rxpipe-nonfatal-nvlink5-single-line.txt").replace("Nonfatal", "Fatal"))
    assert f.status is Status.FAIL and f.data["severity"] == "fatal"


def test_xid45_caused_by_previous_xid_is_judged_as_that_xid():
    fs = xid(log("xid45-caused-by-previous-xid149-xid145-drv590.txt"))
    assert [(f.status, f.data["code"], f.data["events"]) for f in fs] == [(Status.WARN, 145, 5),
                                                                          (Status.WARN, 149, 2)]
    assert fs[0].symptoms == ("nvlink-errors", "xid-145", "xid-45")
    assert fs[0].summary.startswith("Xid 145 NVLINK_RLW_ERROR on 0000:ed:00, 0000:ba:00, 0000:97:00, 5 lines "
                                    "(seen only as Xid 45 'caused by previous Xid 145')")
    assert fs[1].evidence[0].excerpt.count("caused by previous Xid 149") == 2


def test_bare_xid45_is_an_aborted_application_reported_as_info():
    # Synthetic: the first real line without its "caused by previous Xid 149" tail.
    line = log("xid45-caused-by-previous-xid149-xid145-drv590.txt").splitlines()[0]
    [f] = xid(line.replace(" caused by previous Xid 149", ""))
    assert f.status is Status.PASS and f.symptoms == ()
    assert f.summary.startswith("Xid 45 ROBUST_CHANNEL_PREEMPTIVE_REMOVAL on 0000:dc:00")


def test_gsp_rpc_history_dump_fails_as_a_gsp_error():
    [f] = xid(log("gsp-timeout-rpc-history-table-gpu6.txt"))
    assert (f.status, f.symptoms) == (Status.FAIL, ("gpu-gsp-error",))
    # The log prints no Xid 119: the dump is named as what it is, never as an Xid (issue 33).
    assert f.summary == ("GSP RPC history dump (after a GSP RPC timeout or failure) on GPU6, 1 line "
                         "(driver message without an Xid line)")
    assert "xid-119" not in f.symptoms and f.data["fault"] == "gsp" and "code" not in f.data
    assert "no Xid was printed" in f.action and "(RESET_GPU)" in f.action


def test_gsp_core_dump_with_talos_prefix_fails():
    [f] = xid(log("talos-dmesg-prefix-nvrm-gsp-coredump-trace.txt"))
    assert (f.status, f.symptoms) == (Status.FAIL, ("gpu-gsp-error",))
    assert "kflcnCoreDumpNondestructive_IMPL: TRACE: 08" in f.evidence[0].excerpt


def test_nvswitch_sxid_nonfatal_warns_with_its_links():
    [f] = xid(log("h100-cc-nvswitch-sxid-22013-minion-dlreq.txt"))
    assert (f.status, f.symptoms) == (Status.WARN, ("nvlink-errors", "sxid-22013"))
    assert f.summary == "NVSwitch SXid 22013 (Non-fatal) on 0000:04:00.0, links 44, 45, 46, 8 lines"
    [f] = xid(log("nvswitch-sxid-12028-nonfatal-egress-priv-error.txt"))
    assert f.summary == "NVSwitch SXid 12028 (Non-fatal) on 0000:85:00.0, link 61, 1 line"


def test_fatal_sxid_fails():
    # Synthetic: the real SXid 12028 line with "Non-fatal" changed to "Fatal".
    [f] = xid(log("nvswitch-sxid-12028-nonfatal-egress-priv-error.txt").replace("Non-fatal", "Fatal"))
    assert f.status is Status.FAIL and "reboot it so the NVSwitches and GPUs are reset" in f.action


# ---- synthetic events built from real lines ---------------------------------------------------

XID94 = log("h100-xid94-contained-ecc-ch-only.txt").strip()
STAMP = XID94.split("NVRM:")[0]


def test_xid48_double_bit_ecc_fails_with_workflow_48():
    # Synthetic: the real Xid 94 line with its number changed to 48.
    [f] = xid(XID94.replace("): 94,", "): 48,"))
    assert (f.status, f.symptoms) == (Status.FAIL, ("gpu-ecc-uncorrectable", "xid-48"))
    assert "(WORKFLOW_XID_48): Reset the GPU, then check the SRAM DBE threshold" in f.action


def test_three_line_fallen_off_the_bus_fails_without_an_xid_symptom():
    # Synthetic: the real line's timestamp with the driver's three-line message (nv.c format).
    text = "\n".join([STAMP + "NVRM: The NVIDIA GPU 0000:0f:00.0",
                      STAMP + "NVRM: (PCI ID: 10de:2330) installed in this system has",
                      STAMP + "NVRM: fallen off the bus and is not responding to commands."])
    [f] = xid(text)
    assert (f.status, f.symptoms) == (Status.FAIL, ("gpu-fallen-off-bus",))
    assert "on 0000:0f:00.0, 1 line (driver message without an Xid line)" in f.summary
    assert f.evidence[0].excerpt.count("NVRM:") == 3  # the GPU is named two lines up
    assert "(RESTART_BM): Full power cycle of the node." in f.action


def test_xid79_line_and_message_make_one_finding():
    # The Xid 79 line as quoted in docs/sources.md §5.1 (leptonai/gpud), then the one-line message in
    # the form a public A100 log shows ("NVRM: GPU at PCI:0000:17:00.0 has fallen off the bus.").
    text = "\n".join([STAMP + "NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, "
                              "GPU has fallen off the bus.",
                      STAMP + "NVRM: GPU at PCI:0000:05:00 has fallen off the bus."])
    [f] = xid(text)
    assert (f.status, f.symptoms, f.data["events"]) == (Status.FAIL, ("gpu-fallen-off-bus", "xid-79"), 2)
    [d] = diagnose([f], load_knowledge())
    assert d.cause == "gpu-fallen-off-bus" and "Full power cycle" in d.action


@pytest.mark.parametrize("target, status", [("0x0 (None)", Status.PASS), ("0x3 (Drain P2P)", Status.WARN),
                                            ("0x1 (GPU Reset Required)", Status.FAIL),
                                            ("0x2 (Node Reboot Required)", Status.FAIL)])
def test_xid154_is_judged_by_the_recovery_action_it_names(target, status):
    # The Xid 154 line quoted in docs/sources.md §5.1 (NVSentinel test), with each target it lists.
    [f] = xid(f"NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to {target}")
    assert f.status is status
    assert f"recovery action {target.split('(')[1].rstrip(')')}" in f.summary


def test_xid_missing_from_the_catalog_warns():
    # The older Xid line form quoted in docs/sources.md §5.1 (leptonai/gpud); Xid 14 is not catalogued.
    [f] = xid("NVRM: Xid (0000:03:00): 14, Channel 00000001")
    assert (f.status, f.symptoms) == (Status.WARN, ("gpu-xid", "xid-14"))
    assert f.summary.startswith("Xid 14 (not in preflight's Xid catalog) on 0000:03:00")


def test_most_severe_event_comes_first():
    text = "\n".join([log("a100-xid63-row-remapper-pending.txt").strip(), XID94.replace("): 94,", "): 48,")])
    assert [f.status for f in xid(text)] == [Status.FAIL, Status.WARN]


# ---- not applicable, missing ---------------------------------------------------------------

def test_empty_journal_skips():
    [f] = xid("-- No entries --\n")
    assert f.status is Status.SKIP and "no Xid history to judge" in f.summary


def test_kernel_log_not_collected_is_not_applicable_and_a_failed_one_is_an_error():
    [f] = run_check("xid", make_host({}))
    assert f.status is Status.SKIP and f.summary == "not judged: kernel-log not collected in this bundle"
    denied = result("kernel-log", b"", exit_code=1, command=("dmesg",),
                    stderr="dmesg: read kernel buffer failed: Operation not permitted")
    [f] = run_check("xid", make_host({"kernel-log": denied}))
    assert (f.status, f.symptoms) == (Status.ERROR, ("probe-failed",))
    assert "Operation not permitted" in f.evidence[0].excerpt


# ---- the driver's own failure lines, without an Xid (issue 33) --------------------------------

@pytest.mark.parametrize("name, cause, summary", [
    # ublue-os/bazzite#4449: no Xid line; the heartbeat timeout passed the check before.
    ("gsp-rm-heartbeat-timed-out-journalctl-no-hostname.txt", "gpu-gsp-error",
     "GSP heartbeat timed out on GPU0, 1 line (driver message without an Xid line)"),
    # NVIDIA/open-gpu-kernel-modules#789: was reported as "Xid 143" though no Xid was printed.
    ("rminitadapter-failed-cannot-initialize-gsp-firmware-rtx3090-drv550.txt", "gpu-init-failed",
     "GSP firmware could not be initialised; GPU initialisation failed (RmInitAdapter failed) on 0000:98:00.0, "
     "2 lines (driver message without an Xid line, code 0x62:0x65:1792)"),
    # NVIDIA/gpu-operator#1146: the same failure six times in syslog form.
    ("rminitadapter-failed-repeated-syslog-gpu-operator.txt", "gpu-init-failed",
     "GPU initialisation failed (RmInitAdapter failed) on 0000:0a:00.0, 6 lines "
     "(driver message without an Xid line, code 0x24:0x72:1568)"),
    # NVIDIA/nvtrust#77: FSP boot failure on an H100, then RmInitAdapter.
    ("fsp-boot-commands-failed-h100-tdx-cvm.txt", "gpu-init-failed",
     "FSP boot failed; GSP firmware could not be initialised; GPU initialisation failed (RmInitAdapter failed) on "
     "0000:01:00, 5 lines (driver message without an Xid line, code 0x62:0x1a:1792)"),
    # Cyridd/cmpunlocker#4: "Cannot attach gpu" names no GPU; the RmInitAdapter line after it does.
    ("cannot-attach-gpu-rminitadapter-failed-cmp40hx.txt", "gpu-init-failed",
     "GPU initialisation failed (RmInitAdapter failed); driver cannot attach the GPU on 0000:01:00.0, 9 lines "
     "(driver message without an Xid line, code 0x22:0x56:894)"),
    # negativo17/nvidia-driver#158: open module on a GPU without GSP.
    ("gpu-not-supported-by-open-module-no-gsp-gt1030-journalctl.txt", "gpu-driver-unsupported",
     "GPU not supported by the installed driver on 0000:09:00.0, 1 line (driver message without an Xid line)"),
])
def test_driver_failures_without_an_xid_fail_as_what_they_are(name, cause, summary):
    [f] = xid(log(name))
    assert (f.status, f.symptoms, f.summary) == (Status.FAIL, (cause,), summary)
    assert "Xid 1" not in f.summary and not any(s.startswith("xid-") for s in f.symptoms)
    assert "code" not in f.data and f.data["kind"] == "driver"
    [d] = diagnose([f], load_knowledge())
    assert d.cause == cause


def test_rminitadapter_beside_a_printed_xid_joins_it():
    # Synthetic: the real RmInitAdapter lines with the real Xid 94 line of the corpus renumbered to
    # 143 in front: where the log prints the Xid, the driver message is part of that Xid's finding.
    text = "\n".join([XID94.replace("): 94,", "): 143,"),
                      log("rminitadapter-failed-cannot-initialize-gsp-firmware-rtx3090-drv550.txt").strip()])
    [f] = xid(text)
    assert (f.status, f.symptoms, f.data["code"], f.data["events"]) == (Status.FAIL, ("gpu-xid", "xid-143"), 143, 3)
