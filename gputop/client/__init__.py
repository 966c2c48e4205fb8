"""The monitor's side of the agent's socket: find agents, ask them, group their ranks into jobs.

``agents`` finds an agent's socket and sends it one request; ``namespaces`` finds agents in
containers (other pid namespaces) and is wired in by ``agents.use_container_locators()``;
``status_probe`` asks every agent for its status off the event loop; ``jobs`` groups ranks into
jobs and captures them together. What both sides share is ``gputop.core.protocol``. Nothing here
imports ``gputop.agent`` (the training process's side).
"""
