"""Data sets: the simulations of the seed papers and loaders for the real data (read from a
path or ``FEDSTATS_DATA``, never downloaded)."""

from .cmapss import load_cmapss, read_cmapss
from .student import load_student, read_student, student_design

__all__ = ["load_cmapss", "read_cmapss", "load_student", "read_student", "student_design"]
