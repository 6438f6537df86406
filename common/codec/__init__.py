"""Pure codecs for RocketMQ 4.9's store formats: functions over bytes, no files, no clocks."""
