"""Schedules: the scheduler that sends each schedule's messages when they fall due (App runs one;
``pgbroker scheduler`` runs one alone)."""

from pgbroker.schedules._scheduler import Scheduler, SchedulerStats

__all__ = ["Scheduler", "SchedulerStats"]
