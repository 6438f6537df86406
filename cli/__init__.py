"""The rmqstore command-line tool."""
