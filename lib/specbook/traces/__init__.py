"""Proposal traces: what each engine drafted, per request per step, from a separate untimed trace pass.

    records   the record schema, the plugin folder reader, a pass's requests (RequestTrace)
    derive    accepted count per step, matched against the emitted tokens; agreement with the counters
    traceset  TraceSet: what one trace pass gave (records, requests, counters) and what derives from it
    replay    the engine-independent reference: the draft's own greedy proposals (transformers)
    compare   traces against the reference, two engines at matched anchors, systematic mismatches

The pass itself (a server launched with tracing on, giving a TraceSet) is specbook.measure.tracepass: it runs
through an engine, a layer above this one.
"""

from specbook.traces.records import (
    ProposalRecord,
    RequestTrace,
    TraceError,
    TraceReading,
    read_trace_dir,
    records_frame,
)

__all__ = ["ProposalRecord", "RequestTrace", "TraceError", "TraceReading", "read_trace_dir", "records_frame"]
