"""Data sets: the simulations of the seed papers and loaders for the real data (read from a
path or ``FEDSTATS_DATA``, never downloaded)."""

from .cmapss import load_cmapss, load_cmapss_gp, read_cmapss
from .sarcos import load_sarcos_federation, read_sarcos
from .student import load_student, read_student, student_design

__all__ = [
    "load_cmapss",
    "load_cmapss_gp",
    "read_cmapss",
    "load_sarcos_federation",
    "read_sarcos",
    "load_student",
    "read_student",
    "student_design",
]
