"""The harness around the model's editable context, its action modes, the sandbox and the task suite."""
