-- local placeholder, not committed
SELECT 1;
