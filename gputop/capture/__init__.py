"""The capture service: what `gputop capture`, `gputop capture --job`, the monitor's `p` and
`--auto-capture` share (``service``). The command line and the TUI only present its results.
"""
