"""What several test modules share: no test module imports another."""
