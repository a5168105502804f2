"""Proposal traces: what each engine drafted, per request per step, from a separate untimed trace pass.

    records   the record schema and the plugin folder reader
    derive    accepted count per step, matched against the emitted tokens; agreement with the counters
    tracepass traced_config + trace_pass(server, requests, trace_dir) -> TraceSet
    replay    the engine-independent reference: the draft's own greedy proposals (transformers)
    compare   traces against the reference, two engines at matched anchors, systematic mismatches
"""

from specbook.measure.tracepass import RequestTrace, TraceSet, trace_pass, traced_config
from specbook.traces.records import ProposalRecord, TraceError, read_trace_dir, records_frame

__all__ = ["ProposalRecord", "RequestTrace", "TraceError", "TraceSet", "read_trace_dir", "records_frame",
           "trace_pass", "traced_config"]
