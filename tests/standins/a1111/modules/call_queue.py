"""modules.call_queue (stand-in): the lock every generation and GPU job of the webui holds while it runs."""
import threading

queue_lock = threading.Lock()
