"""Figures for the book: one submodule per topic, matplotlib only.

Every function draws on a given (or new) axes and returns the matplotlib object it drew, so
chapters stay short and figures look the same everywhere.
"""
