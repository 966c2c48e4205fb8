"""What the widgets draw from: frames, the layout plan, table rows, severity marks, a
diagnosis as text. Plain data and rich text, no App and no widget."""
