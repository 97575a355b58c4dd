"""tracereplay: replay block I/O traces against drives and files, recording every I/O's timing."""

__version__ = "0.1.0"
