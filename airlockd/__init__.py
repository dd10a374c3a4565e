"""airlockd: agents may propose; trusted code decides what is admitted and what becomes permanent."""

__version__ = "0.1.0"
