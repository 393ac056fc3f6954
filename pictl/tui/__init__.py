"""The Textual dashboard: `pictl` with no command. Only this package imports Textual."""
