"""The rmqstore store library: pure codecs (``rmqstore.common.codec``) and file layers
(``rmqstore.common.files``) for Apache RocketMQ 4.9's on-disk format."""
