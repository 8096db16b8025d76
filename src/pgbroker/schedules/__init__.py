"""Schedules: the scheduler that sends a schedule's messages when they are due."""
