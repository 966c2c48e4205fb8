"""Memory reports on the monitor's side: read back untrusted (``report``), judged
(``verdict``), shown (``render``), found after an out-of-memory error (``oom_files``), and
named in the live findings (``where``). Never Textual."""
