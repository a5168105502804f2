"""Running a book: the papermill runner, resume, the watchdog, the host lock."""
