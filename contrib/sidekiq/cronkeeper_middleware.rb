# frozen_string_literal: true

# Optional Sidekiq server middleware for jobs relayed by cronkeeper (docs/feeding-sidekiq.md).
#
# Sidekiq does not dedupe by jid, and cronkeeper's relay publishes at least once: a relay that
# crashed between publishing a job and recording it publishes it again, with the same jid.
# This middleware, per jid, under the Redis key "<prefix><jid>" (prefix "cronkeeper:sidekiq:",
# or CRONKEEPER_SIDEKIQ_PREFIX):
#
#   (a) records the run: "running:<token>" while it runs, "succeeded" when it returned,
#       "failed" when Sidekiq gave up on it (retries exhausted, or retry: false), each kept for
#       CRONKEEPER_SIDEKIQ_TTL seconds (default 7 days). cronkeeper's relay reads this key to
#       learn that a relayed job finished (overlap "skip" and "serial").
#   (b) skips a copy of a jid that already succeeded or failed for good, or that another
#       process is running right now (CRONKEEPER_SIDEKIQ_DEDUPE=0 turns skipping off and keeps
#       the recording). Sidekiq's own retries of a failed run are not copies: a failure that
#       will be retried clears the key, so the retry runs.
#
# It acts only on jobs that carry "idempotency_key" (the ones cronkeeper relayed).
# Works with Sidekiq 6.x, 7.x and 8.x. Install: require this file from the server's boot code,
# e.g. `sidekiq -r ./config/sidekiq_boot.rb` with `require_relative "cronkeeper_middleware"`.

require "securerandom"
require "sidekiq"

module Cronkeeper
  module SidekiqCompletion
    PREFIX = ENV.fetch("CRONKEEPER_SIDEKIQ_PREFIX", "cronkeeper:sidekiq:")
    TTL = Integer(ENV.fetch("CRONKEEPER_SIDEKIQ_TTL", (7 * 24 * 3600).to_s))
    RUNNING_TTL = Integer(ENV.fetch("CRONKEEPER_SIDEKIQ_RUNNING_TTL", "3600"))
    DEDUPE = ENV.fetch("CRONKEEPER_SIDEKIQ_DEDUPE", "1") != "0"

    # Delete the key only while it still holds this run's token.
    RELEASE = <<~LUA
      if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end
      return 0
    LUA

    def self.key(jid)
      PREFIX + jid
    end

    def self.redis(&block)
      Sidekiq.redis(&block)
    end

    # Called by Sidekiq when it gives up on a job (retries exhausted, or retry: false).
    def self.record_death(job, _exception)
      return unless job["idempotency_key"]

      redis { |conn| conn.call("SET", key(job["jid"]), "failed", "EX", TTL) }
    end

    class Middleware
      # Sidekiq 6: call(worker, job, queue); 7 and 8: the same, with the job instance first.
      def call(_instance, job, _queue)
        return yield unless job["idempotency_key"]

        k = SidekiqCompletion.key(job["jid"])
        token = "running:#{SecureRandom.hex(8)}"
        claimed = SidekiqCompletion.redis do |conn|
          conn.call("SET", k, token, "NX", "EX", SidekiqCompletion::RUNNING_TTL)
        end
        unless claimed
          if SidekiqCompletion::DEDUPE
            state = SidekiqCompletion.redis { |conn| conn.call("GET", k) }
            Sidekiq.logger.info("cronkeeper: skipping duplicate jid=#{job["jid"]} " \
                                "key=#{job["idempotency_key"]} (#{state.to_s.split(":").first})")
            return
          end
          SidekiqCompletion.redis { |conn| conn.call("SET", k, token, "EX", SidekiqCompletion::RUNNING_TTL) }
        end
        begin
          result = yield
        rescue Exception # rubocop:disable Lint/RescueException -- Shutdown too: the job goes back
          SidekiqCompletion.redis { |conn| conn.call("EVAL", RELEASE, 1, k, token) }
          raise
        end
        SidekiqCompletion.redis { |conn| conn.call("SET", k, "succeeded", "EX", SidekiqCompletion::TTL) }
        result
      end
    end
  end
end

Sidekiq.configure_server do |config|
  config.server_middleware { |chain| chain.add Cronkeeper::SidekiqCompletion::Middleware }
  config.death_handlers << Cronkeeper::SidekiqCompletion.method(:record_death)
end
