"""The analysts' side: answers, exports, alerts and the report page, from the public topics alone."""
