"""Data sets: the simulations of the seed papers and loaders for the real data (read from a
path or ``FEDSTATS_DATA``, never downloaded)."""

from .student import load_student, read_student, student_design

__all__ = ["load_student", "read_student", "student_design"]
