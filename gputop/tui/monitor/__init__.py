"""The live monitor's App: its keys, its frames' feed, its capture controller, the replay of
a recording and the plain first frame."""
