"""The screens the Apps push: a process, a job, a node, a diagnosis, memory, stacks, a hang,
help, and the signal confirmation."""
