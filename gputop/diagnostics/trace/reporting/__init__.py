"""Stage 4 of a trace: the report, plain text for a terminal, a log or an issue comment
(the JSON is ``TraceAnalysis.to_json`` in ``analysis``)."""
