"""nactuator: neural actuator models for low-cost servo arms."""

__version__ = "0.1.0"
