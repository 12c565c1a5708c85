-- The detached partition, once checked again under the detach's lock.
DROP TABLE {partition}
