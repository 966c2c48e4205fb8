"""The ground floor: what every other part of gputop stands on.

Data and its text (``model``, ``history``, ``process_info``, ``snapshot_json``,
``snapshot_text``, ``format``, ``errors``, ``validate``), hardware facts (``boards``, ``peaks``,
``pcie``, ``mig_view``), what the agent says and how it is checked (``protocol``,
``agent_status``, ``compile_health``, ``guard_change``, ``efficiency``, ``job_groups``),
namespaces (``pidns``) and the trace file reader the agent shares with the analysis
(``trace_stream``).

Nothing here imports another part of gputop, textual or the training process's side; the agent
imports only this package.
"""
